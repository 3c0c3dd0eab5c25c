"""This node's election clock, persisted in the data directory (exo issue #2197).

A restarted node must not campaign with a stale clock; peers re-teach it the cluster's
clock too, so a lost or corrupt file costs a round at worst, never a wedged election. A
file whose value is out of range (written by a version that took any clock from peers, or
damaged) reads as no clock, with a warning: a restart never fails on it, nor carries it on.
"""

from __future__ import annotations

import logging
from pathlib import Path

from trexo.config import ELECTION_MAX_CLOCK

log = logging.getLogger(__name__)

CLOCK_FILE = "election_clock"
MAX_CLOCK_FILE_BYTES = 32
"""The file holds one integer of at most 16 digits and a newline; more is not ours."""


def load_clock(data_dir: Path, *, max_clock: int = ELECTION_MAX_CLOCK) -> int:
    """The stored clock, or 0 when there is none (or it is unreadable or out of range)."""
    path = data_dir / CLOCK_FILE
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_CLOCK_FILE_BYTES + 1)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        log.warning("cannot read the election clock in %s (%s); starting from 0", path, exc)
        return 0
    try:
        clock = int(raw.decode("ascii")) if len(raw) <= MAX_CLOCK_FILE_BYTES else -1
    except (UnicodeDecodeError, ValueError):
        clock = -1
    if not 0 <= clock <= max_clock:
        log.warning(
            "the election clock in %s is not a clock up to %d; starting from 0", path, max_clock
        )
        return 0
    return clock


def store_clock(data_dir: Path, clock: int, *, max_clock: int = ELECTION_MAX_CLOCK) -> None:
    """Write atomically: a crash mid-write must not lose the clock. `ValueError` for a clock
    out of range (the election never makes one: it would be a bug, not a peer's doing)."""
    if not 0 <= clock <= max_clock:
        raise ValueError(f"election clock {clock} is outside 0..{max_clock}")
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = data_dir / f"{CLOCK_FILE}.tmp"
    tmp.write_text(f"{clock}\n")
    tmp.replace(data_dir / CLOCK_FILE)
