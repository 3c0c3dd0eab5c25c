"""The event log out of file descriptors: its open is retried, then it gives up clearly."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from fd_exhaustion import exhausted_fds

from tests.waiting import wait_until
from trexo.fd_limit import is_fd_exhaustion
from trexo.master.event_log import open_event_log, read_log
from trexo.master.session_store import segment_path, session_dir
from trexo.types.events import IndexedEvent, NodeUpdated
from trexo.types.ids import NodeId
from trexo.types.session import Session
from trexo.types.state import NodeInfo

SESSION = Session(4, NodeId("master"))
EVENT = IndexedEvent(SESSION, 0, NodeUpdated(NodeInfo(NodeId("n0"), "h", 100, 1)))
BOUND_S = 10.0


async def test_open_waits_for_descriptors_then_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = segment_path(session_dir(tmp_path / "events", SESSION), 0)
    appended = trio.Event()

    async def master() -> None:
        async with open_event_log(path, open_attempts=100, open_retry=0.05) as ev_log:
            await ev_log.append(EVENT)
            appended.set()

    with trio.fail_after(BOUND_S):
        async with trio.open_nursery() as nursery:
            with exhausted_fds():
                nursery.start_soon(master)
                await wait_until(
                    lambda: "(attempt 3 of 100)" in caplog.text,
                    timeout=5.0,
                    what="the third failed open",
                )
                assert not appended.is_set()  # still out of descriptors: still waiting
        assert read_log(path) == [EVENT]
    assert f"event log {path}: Too many open files (attempt 1 of 100)" in caplog.text
    assert "Traceback" not in caplog.text


async def test_open_gives_up_after_its_attempts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = segment_path(session_dir(tmp_path, SESSION), 0)
    with trio.fail_after(BOUND_S), exhausted_fds(), pytest.raises(OSError) as raised:
        async with open_event_log(path, open_attempts=3, open_retry=0.01):
            pytest.fail("opened without a file descriptor")
    assert is_fd_exhaustion(raised.value)
    assert f"event log {path}: Too many open files; giving up after 3 attempts" in caplog.text
