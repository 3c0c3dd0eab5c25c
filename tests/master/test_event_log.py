"""The durable event log: JSON lines, batched fsync, a truncated last line tolerated."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import trio

from tests.waiting import wait_until
from trexo import wire
from trexo.errors import MalformedMessage
from trexo.master.event_log import open_event_log, read_log, scan_log
from trexo.master.session_store import segment_path, session_dir
from trexo.types.events import IndexedEvent, NodeRemoved, NodeUpdated
from trexo.types.ids import NodeId
from trexo.types.session import Session
from trexo.types.state import NodeInfo

SESSION = Session(3, NodeId("master"))
BOUND_S = 10.0


def events(n: int, start: int = 0) -> list[IndexedEvent]:
    return [
        IndexedEvent(SESSION, k, NodeUpdated(NodeInfo(NodeId(f"n{k}"), "h", 100, k)))
        for k in range(start, start + n)
    ]


def new_segment(events_dir: Path) -> Path:
    """The first segment's path in a fresh session directory."""
    directory = session_dir(events_dir, SESSION)
    directory.mkdir(parents=True, exist_ok=True)
    return segment_path(directory, 0)


def test_log_path_names_the_session(tmp_path: Path) -> None:
    path = new_segment(tmp_path)
    assert path == tmp_path / "session-3-master" / "events-0.jsonl"


async def test_appends_read_back_in_order(tmp_path: Path) -> None:
    path = segment_path(session_dir(tmp_path / "events", SESSION), 0)  # the directory is created
    with trio.fail_after(BOUND_S):
        async with open_event_log(path) as ev_log:
            for event in events(5):
                await ev_log.append(event)
            assert ev_log.statistics().records_written == 5
            # Written and flushed on return from append: readable before any fsync.
            assert read_log(path) == events(5)
    lines = path.read_bytes().splitlines()
    assert [wire.from_json(line, IndexedEvent) for line in lines] == events(5)


async def test_fsync_is_batched_and_done_on_close(tmp_path: Path) -> None:
    path = new_segment(tmp_path)
    with trio.fail_after(BOUND_S):
        async with open_event_log(path, fsync_interval=3600.0) as ev_log:
            for event in events(20):
                await ev_log.append(event)
            await wait_until(
                lambda: ev_log.statistics().fsyncs, timeout=5.0, what="the flusher's first fsync"
            )
            stats = ev_log.statistics()
            # The first append woke the flusher; the rest wait out the (long) interval.
            assert 1 <= stats.fsyncs < 20
            await ev_log.append(events(1, start=20)[0])
            assert ev_log.statistics().unsynced
        final = ev_log.statistics()
    assert not final.unsynced
    assert final.fsyncs == stats.fsyncs + 1
    assert len(read_log(path)) == 21


async def test_fsync_every_event_when_the_interval_is_zero(tmp_path: Path) -> None:
    path = new_segment(tmp_path)
    with trio.fail_after(BOUND_S):
        async with open_event_log(path, fsync_interval=0) as ev_log:
            for event in events(3):
                await ev_log.append(event)
            assert ev_log.statistics().fsyncs == 3
            assert not ev_log.statistics().unsynced


async def test_append_adds_well_under_a_millisecond(tmp_path: Path) -> None:
    """A sanity bound, not a benchmark: the median append with the default policy."""
    path = new_segment(tmp_path)
    times = []
    with trio.fail_after(BOUND_S):
        async with open_event_log(path) as ev_log:
            for event in events(200):
                start = time.perf_counter()
                await ev_log.append(event)
                times.append(time.perf_counter() - start)
    times.sort()
    assert times[len(times) // 2] < 0.005  # ~0.1 ms measured; generous for noisy machines


def test_a_truncated_last_line_is_skipped_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = new_segment(tmp_path)
    whole = b"".join(wire.to_json(e, IndexedEvent) + b"\n" for e in events(3))
    path.write_bytes(whole + wire.to_json(events(1, start=3)[0], IndexedEvent)[:25])
    with caplog.at_level(logging.WARNING, logger="trexo.master.event_log"):
        assert read_log(path) == events(3)
    assert any("truncated last line 4" in r.getMessage() for r in caplog.records)
    assert scan_log(path) == (events(3), len(whole))


def test_a_corrupt_line_in_the_middle_is_an_error(tmp_path: Path) -> None:
    path = new_segment(tmp_path)
    good = wire.to_json(events(1)[0], IndexedEvent)
    path.write_bytes(good + b"\n" + b'{"not": "an event"}\n' + good + b"\n")
    with pytest.raises(MalformedMessage, match="line 2"):
        read_log(path)


async def test_reopening_cuts_a_truncated_line_and_appends_cleanly(tmp_path: Path) -> None:
    path = new_segment(tmp_path)
    first = b"".join(wire.to_json(e, IndexedEvent) + b"\n" for e in events(2))
    path.write_bytes(first + b'{"session": {"clo')
    more = IndexedEvent(SESSION, 2, NodeRemoved(NodeId("n0")))
    with trio.fail_after(BOUND_S):
        async with open_event_log(path) as ev_log:
            await ev_log.append(more)
    assert read_log(path) == [*events(2), more]
