"""This node's election clock, persisted in the data directory (exo issue #2197).

A restarted node must not campaign with a stale clock; peers re-teach it the cluster's
clock too, so a lost or corrupt file costs a round at worst, never a wedged election.
"""

from __future__ import annotations

from pathlib import Path

CLOCK_FILE = "election_clock"


def load_clock(data_dir: Path) -> int:
    """The stored clock, or 0 when there is none (or it is unreadable)."""
    try:
        return int((data_dir / CLOCK_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return 0


def store_clock(data_dir: Path, clock: int) -> None:
    """Write atomically: a crash mid-write must not lose the clock."""
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = data_dir / f"{CLOCK_FILE}.tmp"
    tmp.write_text(f"{clock}\n")
    tmp.replace(data_dir / CLOCK_FILE)
