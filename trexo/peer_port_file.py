"""The peer port a node listens on, written into its data directory at every start.

With `--peer-port 0` the kernel picks the port; tools (and tests) that start a node that way
read it here, whatever the log level, to point other nodes at it (`--peer HOST:PORT`).
Written once the port is bound and before the API answers, so a client that has seen the
API ready finds this start's port, never the previous one's.
"""

from __future__ import annotations

import os
from pathlib import Path

PEER_PORT_FILE = "peer_port"


def write_peer_port(data_dir: Path, port: int) -> None:
    """Replace `data_dir`'s peer port file atomically (a reader sees the old or the new)."""
    path = data_dir / PEER_PORT_FILE
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)


def read_peer_port(data_dir: Path) -> int | None:
    """The port the node in `data_dir` last wrote, or None before it wrote one."""
    try:
        return int((data_dir / PEER_PORT_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
