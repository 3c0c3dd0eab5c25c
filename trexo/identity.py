"""A node's persistent identity: a random id created once and kept in the data directory."""

from __future__ import annotations

import os
from pathlib import Path

from trexo.types.ids import NodeId, new_id

NODE_ID_FILE = "node_id"


def load_or_create_node_id(data_dir: Path) -> NodeId:
    """The node id stored in `data_dir`, creating (atomically) a new one the first time."""
    path = data_dir / NODE_ID_FILE
    try:
        return NodeId(path.read_text().strip())
    except FileNotFoundError:
        pass
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(new_id() + "\n")
    try:
        os.link(tmp, path)  # fails if another process created it first: theirs wins
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return NodeId(path.read_text().strip())
