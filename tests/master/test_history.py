"""The master's bounded history: a snapshot and its tail replay to the same state as the
whole log (hypothesis), over the wire too; on disk, a rolled session reads back whole."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from state_strategies import event_lists

from trexo import wire
from trexo.master.history import History, SnapshotPolicy
from trexo.state import apply_all
from trexo.types.events import Event, IndexedEvent, SessionOpened
from trexo.types.ids import NodeId
from trexo.types.session import Session
from trexo.types.snapshot import StateSnapshot
from trexo.types.state import State

SESSION = Session(7, NodeId("m"))


def _indexed(events: list[Event]) -> list[IndexedEvent]:
    return [IndexedEvent(SESSION, k, e) for k, e in enumerate(events)]


def _run(events: list[IndexedEvent], snapshot_at: set[int]) -> tuple[History, State]:
    """Feed `events` to a History as a master does, snapshotting after the given indices."""
    history = History(SESSION)
    state = State()
    for event in events:
        history.append(event)
        state = apply_all(state, [event])
        if event.index in snapshot_at:
            history.take_snapshot(state)
    return history, state


def _replayed(history: History, from_index: int, known: State) -> State:
    """What a node that applied events before `from_index` (giving `known`) ends with."""
    replay = history.replay(from_index)
    state = known
    if replay.snapshot is not None:
        # As it travels: encoded and decoded.
        snapshot = wire.from_json(wire.to_json(replay.snapshot, StateSnapshot), StateSnapshot)
        state = snapshot.state
    return apply_all(state, replay.events)


@given(event_lists, st.data())
def test_snapshot_and_tail_equal_the_full_replay(evs: list[Event], data: st.DataObject) -> None:
    events = _indexed(evs)
    indices = st.sampled_from(range(len(events))) if events else st.nothing()
    snapshot_at = set(data.draw(st.lists(indices, unique=True)))
    history, full = _run(events, snapshot_at)
    # From scratch (a joiner), and from any point a node may have reached.
    from_index = data.draw(st.integers(0, len(events)))
    known = apply_all(State(), events[:from_index])
    assert _replayed(history, 0, State()) == full
    assert _replayed(history, from_index, known) == full
    # Memory holds only the events after the last snapshot.
    last = max(snapshot_at, default=-1)
    assert history.events_in_memory == len(events) - 1 - last
    assert history.next_index == len(events)


def test_a_snapshot_must_match_the_last_event() -> None:
    history = History(SESSION)
    history.append(IndexedEvent(SESSION, 0, SessionOpened()))
    with pytest.raises(ValueError, match="does not match"):
        history.take_snapshot(State())  # last_index -1, but event 0 is in
    with pytest.raises(ValueError, match="does not follow"):
        history.append(IndexedEvent(SESSION, 5, SessionOpened()))


def test_snapshot_policy_counts_events_and_time() -> None:
    policy = SnapshotPolicy(every_events=100, every_s=60.0)
    assert not policy.due(0, 1e9)  # nothing new: no snapshot
    assert not policy.due(99, 59.0)
    assert policy.due(100, 0.0)
    assert policy.due(1, 60.0)
