"""Timestamped lifecycle events for benchmarks, off unless `TREXO_TRACE_FILE` is set.

Each event is one JSON line `{"t": <unix time>, "node": ..., "event": ..., ...}` appended
to the file, so a benchmark can line up what several node processes on one machine did.
Writes are small and rare (elections, swaps), so they are done synchronously.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

TRACE_FILE_ENV = "TREXO_TRACE_FILE"

_path = os.environ.get(TRACE_FILE_ENV)


def tracing() -> bool:
    return _path is not None


def trace(node_id: str, event: str, **fields: Any) -> None:
    """Record `event` for `node_id` now (no-op when tracing is off)."""
    if _path is None:
        return
    record = {"t": time.time(), "node": node_id, "event": event, **fields}
    with open(_path, "a") as file:
        file.write(json.dumps(record) + "\n")
