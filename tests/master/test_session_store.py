"""The master's files: snapshots written crash-safely, rolled segments, torn tails cut,
undecodable snapshots skipped, old sessions pruned to the retention."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from trexo import wire
from trexo.master.event_log import encode_record
from trexo.master.session_store import (
    disk_bytes,
    drop_superseded,
    prune_sessions,
    read_newest_session,
    read_session,
    segment_path,
    session_dir,
    snapshot_path,
    stored_sessions,
    write_snapshot,
)
from trexo.state import apply_all
from trexo.types.events import IndexedEvent, NodeUpdated
from trexo.types.ids import NodeId
from trexo.types.session import Session
from trexo.types.snapshot import StateSnapshot
from trexo.types.state import NodeInfo, State

SESSION = Session(4, NodeId("m"))


def events(n: int, start: int = 0, session: Session = SESSION) -> list[IndexedEvent]:
    return [
        IndexedEvent(session, k, NodeUpdated(NodeInfo(NodeId(f"n{k}"), "h", 100, k)))
        for k in range(start, start + n)
    ]


def write_segment(directory: Path, evs: list[IndexedEvent]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = segment_path(directory, evs[0].index)
    path.write_bytes(b"".join(encode_record(e) for e in evs))
    return path


def snapshot_of(evs: list[IndexedEvent]) -> StateSnapshot:
    return StateSnapshot(SESSION, evs[-1].index, apply_all(State(), evs))


def test_a_rolled_session_reads_back_as_its_newest_snapshot_and_tail(tmp_path: Path) -> None:
    directory = session_dir(tmp_path, SESSION)
    write_segment(directory, events(10))
    write_snapshot(directory, snapshot_of(events(10)))
    write_segment(directory, events(5, start=10))
    stored = read_session(directory, SESSION)
    assert stored.snapshot == snapshot_of(events(10))
    assert stored.events == tuple(events(5, start=10))
    assert stored.next_index == 15
    # Dropping what the snapshot covers frees the old segment and keeps the answer.
    assert drop_superseded(directory, 9) > 0
    assert read_session(directory, SESSION) == stored
    assert sorted(p.name for p in directory.iterdir()) == ["events-10.jsonl", "snapshot-9.json"]


def test_a_crash_mid_snapshot_leaves_the_previous_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = session_dir(tmp_path, SESSION)
    write_segment(directory, events(10))
    write_snapshot(directory, snapshot_of(events(4)))
    # A crash before the rename leaves a temporary file, never a torn snapshot.
    half = wire.to_json(snapshot_of(events(10)), StateSnapshot)[:50]
    (directory / "snapshot-9.json.tmp").write_bytes(half)
    with caplog.at_level(logging.WARNING):
        stored = read_session(directory, SESSION)
    assert stored.snapshot == snapshot_of(events(4))
    assert stored.events == tuple(events(6, start=4))
    assert not (directory / "snapshot-9.json.tmp").exists()
    assert "unfinished" in caplog.text


def test_a_snapshot_that_does_not_decode_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = session_dir(tmp_path, SESSION)
    write_segment(directory, events(10))
    write_snapshot(directory, snapshot_of(events(4)))
    snapshot_path(directory, 9).write_bytes(b'{"garbage":')
    with caplog.at_level(logging.WARNING):
        stored = read_session(directory, SESSION)
    assert stored.snapshot is not None and stored.snapshot.index == 3
    assert len(stored.events) == 6
    assert "does not decode" in caplog.text


def test_a_torn_tail_is_cut_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = session_dir(tmp_path, SESSION)
    path = write_segment(directory, events(3))
    with open(path, "ab") as file:
        file.write(encode_record(events(1, start=3)[0])[:-9])  # no newline: torn
    with caplog.at_level(logging.WARNING):
        stored = read_session(directory, SESSION)
    assert stored.events == tuple(events(3))
    assert "truncated" in caplog.text


def test_events_out_of_order_are_corruption(tmp_path: Path) -> None:
    from trexo.errors import MalformedMessage

    directory = session_dir(tmp_path, SESSION)
    write_segment(directory, [*events(2), *events(1, start=5)])
    with pytest.raises(MalformedMessage, match="out of order"):
        read_session(directory, SESSION)


def test_the_newest_readable_session_is_found(tmp_path: Path) -> None:
    old, new = Session(1, NodeId("a")), Session(2, NodeId("a"))
    write_segment(session_dir(tmp_path, old), events(3, session=old))
    assert read_newest_session(tmp_path) is not None
    session_dir(tmp_path, new).mkdir()  # empty: nothing to restore from it
    stored = read_newest_session(tmp_path)
    assert stored is not None and stored.session == old
    write_segment(session_dir(tmp_path, new), events(2, session=new))
    stored = read_newest_session(tmp_path)
    assert stored is not None and stored.session == new and len(stored.events) == 2
    assert read_newest_session(tmp_path / "nothing") is None


def test_old_sessions_are_pruned_by_count_then_bytes(tmp_path: Path) -> None:
    sessions = [Session(clock, NodeId("a")) for clock in range(1, 7)]
    for session in sessions:
        write_segment(session_dir(tmp_path, session), events(20, session=session))
    (tmp_path / "session-0-a.jsonl").write_bytes(b"")  # an older trexo's single file
    current = sessions[-1]
    pruned = prune_sessions(tmp_path, current, keep_sessions=4, max_bytes=10**9)
    assert len(pruned) == 3
    assert [s for s, _ in stored_sessions(tmp_path)] == sessions[2:]
    one = disk_bytes(session_dir(tmp_path, current))
    pruned = prune_sessions(tmp_path, current, keep_sessions=4, max_bytes=2 * one + one // 2)
    assert [s for s, _ in stored_sessions(tmp_path)] == sessions[-2:]
    # The current session is kept whatever its size.
    prune_sessions(tmp_path, current, keep_sessions=1, max_bytes=0)
    assert [s for s, _ in stored_sessions(tmp_path)] == [current]
    assert os.listdir(session_dir(tmp_path, current))
