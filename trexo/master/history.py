"""What a master remembers of its session: the newest snapshot and the events after it.

Pure bookkeeping, no I/O. Events before the snapshot are dropped, so memory stays bounded
by the snapshot policy however long the session runs; a replay from before the snapshot is
answered with the snapshot followed by every event after it, which `apply` turns into the
same state as the whole log (tested with hypothesis).
"""

from __future__ import annotations

import attrs

from trexo.types.events import IndexedEvent
from trexo.types.session import Session
from trexo.types.snapshot import StateSnapshot
from trexo.types.state import State


@attrs.frozen
class SnapshotPolicy:
    """When a new snapshot is due: after `every_events` events, or `every_s` seconds after
    the last one if any event came since."""

    every_events: int
    every_s: float

    def due(self, events_since: int, seconds_since: float) -> bool:
        if events_since <= 0:
            return False
        return events_since >= self.every_events or seconds_since >= self.every_s


@attrs.frozen
class Replay:
    """What answers a replay request: an optional snapshot, then events in index order."""

    snapshot: StateSnapshot | None
    events: tuple[IndexedEvent, ...]


class History:
    """A session's events since its newest snapshot. `next_index` is the next event's index."""

    def __init__(self, session: Session, snapshot: StateSnapshot | None = None) -> None:
        self.session = session
        self.snapshot = snapshot
        self._tail: list[IndexedEvent] = []

    @property
    def next_index(self) -> int:
        if self._tail:
            return self._tail[-1].index + 1
        return self.snapshot.index + 1 if self.snapshot is not None else 0

    @property
    def events_in_memory(self) -> int:
        return len(self._tail)

    def append(self, event: IndexedEvent) -> None:
        if event.index != self.next_index or event.session != self.session:
            raise ValueError(
                f"event {event.index} of {event.session} does not follow "
                f"{self.next_index - 1} of {self.session}"
            )
        self._tail.append(event)

    def take_snapshot(self, state: State) -> StateSnapshot:
        """Record `state` (what every event so far produced) and forget those events."""
        if state.last_index != self.next_index - 1:
            raise ValueError(
                f"a snapshot of state at {state.last_index} does not match the log's "
                f"last index {self.next_index - 1}"
            )
        self.snapshot = StateSnapshot(self.session, state.last_index, state)
        self._tail.clear()
        return self.snapshot

    def replay(self, from_index: int) -> Replay:
        """What brings a node that has applied every event before `from_index` up to date."""
        snapshot = self.snapshot
        if snapshot is not None and from_index <= snapshot.index:
            return Replay(snapshot, tuple(self._tail))
        first = self._tail[0].index if self._tail else self.next_index
        return Replay(None, tuple(self._tail[max(0, from_index - first) :]))
