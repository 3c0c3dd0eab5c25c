"""The master's files: one directory per session, holding its newest snapshot and the
events after it; old sessions pruned to a retention.

    <events dir>/session-<clock>-<master id>/
        snapshot-<index>.json     the state after events 0..index (`StateSnapshot`)
        events-<first>.jsonl      events from index <first> on (`trexo.master.event_log`)

The log is rolled at each snapshot: the snapshot is written (temporary name, fsync, rename,
directory fsync), appends move to a new segment that starts after it, and only then are the
older snapshot and segments deleted. A crash at any point leaves a complete set: the newest
snapshot that made it to disk, and every event after it. A snapshot that does not decode (it
cannot be torn: it appears only by rename) is skipped with a warning for the one before it.

Everything here is synchronous file work; the master calls it through a worker thread.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

import attrs

from trexo import wire
from trexo.durable import fsync_dir
from trexo.errors import MalformedMessage
from trexo.master.event_log import scan_log
from trexo.state import apply_all
from trexo.types.events import IndexedEvent
from trexo.types.ids import NodeId
from trexo.types.session import Session
from trexo.types.snapshot import StateSnapshot
from trexo.types.state import State

log = logging.getLogger(__name__)

_SESSION_NAME = re.compile(r"session-(\d+)-(.+?)(\.jsonl)?")
_SNAPSHOT_NAME = re.compile(r"snapshot-(\d+)\.json")
_SEGMENT_NAME = re.compile(r"events-(\d+)\.jsonl")
TEMPORARY_SUFFIX = ".tmp"


def session_dir(events_dir: Path, session: Session) -> Path:
    return events_dir / f"session-{session.clock}-{session.master_id}"


def segment_path(directory: Path, first_index: int) -> Path:
    return directory / f"events-{first_index}.jsonl"


def snapshot_path(directory: Path, index: int) -> Path:
    return directory / f"snapshot-{index}.json"


def _numbered(directory: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    """Files of `directory` named by `pattern`, by their number, oldest first."""
    found = []
    for path in directory.iterdir():
        if match := pattern.fullmatch(path.name):
            found.append((int(match.group(1)), path))
    return sorted(found)


# --- reading -------------------------------------------------------------------------------


@attrs.frozen
class StoredSession:
    """What a session directory holds: its newest good snapshot and the events after it."""

    session: Session
    snapshot: StateSnapshot | None
    events: tuple[IndexedEvent, ...]

    @property
    def state(self) -> State:
        """The state the session's log stands for."""
        start = self.snapshot.state if self.snapshot is not None else State()
        return apply_all(start, self.events)

    @property
    def next_index(self) -> int:
        if self.events:
            return self.events[-1].index + 1
        return self.snapshot.index + 1 if self.snapshot is not None else 0


def read_session(directory: Path, session: Session) -> StoredSession:
    """The newest snapshot of `directory` and the events after it, checked for order.

    A truncated last line (a crash mid-append) is cut with a warning by `scan_log`; events
    out of order or of another session are corruption and raise `MalformedMessage`.
    """
    if not directory.is_dir():
        return StoredSession(session, None, ())
    for stray in directory.glob(f"*{TEMPORARY_SUFFIX}"):
        log.warning("event log: removing %s, a snapshot a crash left unfinished", stray)
        stray.unlink(missing_ok=True)
    snapshot = _newest_snapshot(directory, session)
    after = snapshot.index if snapshot is not None else -1
    events: list[IndexedEvent] = []
    for _, segment in _numbered(directory, _SEGMENT_NAME):
        found, _ = scan_log(segment)
        events += [event for event in found if event.index > after]
    for expected, event in enumerate(events, start=after + 1):
        if event.index != expected or event.session != session:
            raise MalformedMessage(
                f"event log {directory} is out of order: expected index {expected} of "
                f"{session}, found {event.index} of {event.session}"
            )
    return StoredSession(session, snapshot, tuple(events))


def _newest_snapshot(directory: Path, session: Session) -> StateSnapshot | None:
    for index, path in reversed(_numbered(directory, _SNAPSHOT_NAME)):
        try:
            snapshot: StateSnapshot = wire.from_json(path.read_bytes(), StateSnapshot)
        except MalformedMessage as exc:
            log.warning("event log: skipping snapshot %s that does not decode: %s", path, exc)
            continue
        if snapshot.index != index or snapshot.session != session:
            log.warning("event log: skipping snapshot %s of another index or session", path)
            continue
        return snapshot
    return None


def stored_sessions(events_dir: Path) -> list[tuple[Session, Path]]:
    """Every session's files in `events_dir` (directories, and single-file logs of older
    trexo versions), oldest session first."""
    if not events_dir.is_dir():
        return []
    found = []
    for path in events_dir.iterdir():
        if match := _SESSION_NAME.fullmatch(path.name):
            found.append((Session(int(match.group(1)), NodeId(match.group(2))), path))
    return sorted(found)


def read_newest_session(events_dir: Path) -> StoredSession | None:
    """The newest session this node was master of, as far as its files go (None if none
    reads back): what a restarted node knew of the cluster."""
    for session, path in reversed(stored_sessions(events_dir)):
        if not path.is_dir():
            continue
        try:
            stored = read_session(path, session)
        except (OSError, MalformedMessage) as exc:
            log.warning("event log: cannot read session %s (%s); trying an older one", path, exc)
            continue
        if stored.snapshot is not None or stored.events:
            return stored
    return None


# --- writing -------------------------------------------------------------------------------


def write_snapshot(directory: Path, snapshot: StateSnapshot) -> Path:
    """Write `snapshot` crash-safely: it is either whole under its name, or not there."""
    return install_snapshot(write_temporary_snapshot(directory, snapshot))


def write_temporary_snapshot(directory: Path, snapshot: StateSnapshot) -> Path:
    """The first half of `write_snapshot`: the snapshot, fsynced, under a temporary name
    that readers ignore (and remove)."""
    final = snapshot_path(directory, snapshot.index)
    temporary = final.with_name(final.name + TEMPORARY_SUFFIX)
    data = wire.to_json(snapshot, StateSnapshot)
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    return temporary


def install_snapshot(temporary: Path) -> Path:
    """The second half: rename it to its name, and make the rename durable."""
    final = temporary.with_name(temporary.name.removesuffix(TEMPORARY_SUFFIX))
    os.replace(temporary, final)
    fsync_dir(temporary.parent)
    return final


def drop_superseded(directory: Path, snapshot_index: int) -> int:
    """Delete the snapshots before `snapshot_index` and the segments it covers (each starts
    at or before it: the log was rolled to `events-<snapshot_index + 1>` at this snapshot).
    Returns the bytes freed."""
    freed = 0
    for index, path in _numbered(directory, _SNAPSHOT_NAME):
        if index < snapshot_index:
            freed += _delete(path)
    for first, path in _numbered(directory, _SEGMENT_NAME):
        if first <= snapshot_index:
            freed += _delete(path)
    return freed


def prune_sessions(
    events_dir: Path, current: Session, *, keep_sessions: int, max_bytes: int
) -> list[Path]:
    """Delete the oldest sessions' files beyond the newest `keep_sessions` (the current one
    counted), then more of the oldest while all of them together exceed `max_bytes`. The
    current session's files are never deleted. Returns what was deleted."""
    others = [(s, p) for s, p in stored_sessions(events_dir) if s != current]
    keep_others = max(0, keep_sessions - 1)
    doomed = others[: max(0, len(others) - keep_others)]
    kept = others[len(doomed) :]
    total = disk_bytes(session_dir(events_dir, current)) + sum(disk_bytes(p) for _, p in kept)
    while kept and total > max_bytes:
        oldest = kept.pop(0)
        total -= disk_bytes(oldest[1])
        doomed.append(oldest)
    for _, path in doomed:
        _delete(path)
    if doomed:
        log.info("event log: pruned %d old session(s) beyond the retention", len(doomed))
    return [path for _, path in doomed]


def disk_bytes(path: Path) -> int:
    """Bytes in the file at `path`, or in every file below the directory at `path`."""
    try:
        if not path.is_dir():
            return path.stat().st_size
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    except FileNotFoundError:
        return 0


def _delete(path: Path) -> int:
    size = disk_bytes(path)
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    return size
