"""The state view: in-order application, duplicates, gap repair by replay, late joiners.

Most tests play the master themselves: they publish indexed events straight on the router
(out of order, twice, skipping one) and answer the view's replay requests by hand.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from trexo.config import MasterConfig, StateViewConfig
from trexo.master.service import Master
from trexo.net.router import Envelope, Router
from trexo.net.topics import Topic
from trexo.state import apply_all
from trexo.types.commands import RequestReplay
from trexo.types.events import IndexedEvent, NodeUpdated
from trexo.types.ids import NodeId
from trexo.types.local_events import NodeReport
from trexo.types.session import Session
from trexo.types.snapshot import StateSnapshot
from trexo.types.state import NodeInfo, State
from trexo.worker.state_view import ReorderBuffer, StateView

BOUND_S = 10.0
RETRY_S = 1.0
ME = NodeId("me")
SESSION = Session(1, ME)


def event(k: int, session: Session = SESSION) -> IndexedEvent:
    return IndexedEvent(session, k, NodeUpdated(NodeInfo(NodeId(f"n{k}"), "h", 100, k)))


def expected(n: int) -> State:
    return apply_all(State(), [event(k) for k in range(n)])


@attrs.define
class FakeMaster:
    """The test's side: publishes events and sees the view's replay requests."""

    router: Router
    view: StateView
    requests: trio.MemoryReceiveChannel[Envelope]

    async def publish(self, *indices: int) -> None:
        for k in indices:
            await self.router.publish(Topic.GLOBAL_EVENTS, event(k))

    async def next_request(self) -> RequestReplay:
        envelope = await self.requests.receive()
        assert isinstance(envelope.payload, RequestReplay)
        return envelope.payload

    def pending_requests(self) -> list[RequestReplay]:
        found = []
        while True:
            try:
                found.append(self.requests.receive_nowait().payload)
            except trio.WouldBlock:
                return found


@asynccontextmanager
async def fake_master(
    config: StateViewConfig | None = None, session: Session = SESSION
) -> AsyncIterator[FakeMaster]:
    router = Router(ME)
    with trio.fail_after(BOUND_S), router.subscribe(Topic.COMMANDS) as requests:
        async with trio.open_nursery() as nursery:
            view = await nursery.start(StateView(router, session, config=config).run)
            fake = FakeMaster(router, view, requests)
            # Every view starts by asking for the whole session.
            assert (await fake.next_request()).from_index == 0
            yield fake
            nursery.cancel_scope.cancel()


# --- the reorder buffer (pure) -------------------------------------------------------------


@given(st.integers(0, 30), st.randoms(use_true_random=False), st.integers(0, 10))
def test_reorder_buffer_releases_each_index_once_in_order(
    n: int, rnd: random.Random, extra: int
) -> None:
    arrivals = list(range(n)) + [rnd.randrange(n) for _ in range(extra if n else 0)]
    rnd.shuffle(arrivals)
    buffer = ReorderBuffer(max_pending=1000)
    released = [e.index for k in arrivals for e in buffer.offer(event(k))]
    assert released == list(range(n))
    assert not buffer.has_gap
    assert buffer.duplicates == len(arrivals) - n


def test_reorder_buffer_drops_early_events_beyond_its_bound() -> None:
    buffer = ReorderBuffer(max_pending=2)
    assert buffer.offer(event(2)) == []
    assert buffer.offer(event(3)) == []
    assert buffer.offer(event(4)) == []  # no room: dropped, the replay brings it again
    assert buffer.overflowed == 1
    assert [e.index for e in buffer.offer(event(0))] == [0]
    assert [e.index for e in buffer.offer(event(1))] == [1, 2, 3]
    assert buffer.next_index == 4
    assert buffer.has_gap  # 4 was seen, though not kept
    assert [e.index for e in buffer.offer(event(4))] == [4]
    assert not buffer.has_gap


# --- the service, against a fake master ----------------------------------------------------


async def test_applies_events_in_order_and_drops_duplicates(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with fake_master() as m:
        await m.publish(0, 1, 1, 0, 2)
        state = await m.view.wait_until(lambda s: s.last_index == 2)
        assert state == expected(3)
        await trio.testing.wait_all_tasks_blocked()
        stats = m.view.statistics()
        assert stats.events_applied == 3
        assert stats.duplicates_dropped == 2
        assert m.pending_requests() == []  # no gap, no replay


async def test_a_gap_asks_for_a_replay_and_is_repaired(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with fake_master() as m:
        await m.publish(0, 2, 3)  # 1 went missing
        request = await m.next_request()
        assert request.from_index == 1
        await trio.testing.wait_all_tasks_blocked()
        assert m.view.state == expected(1)
        assert m.view.statistics().pending == 2
        await m.publish(4)  # a gap already asked about: no second request yet
        await trio.testing.wait_all_tasks_blocked()
        assert m.pending_requests() == []
        await m.publish(1, 2, 3, 4)  # the replay; 2..4 are duplicates by now
        state = await m.view.wait_until(lambda s: s.last_index == 4)
        assert state == expected(5)
        # Virtual time, 3 retry intervals: a re-request, had the gap persisted, would have
        # been sent by then.
        await trio.sleep(3 * RETRY_S)
        assert m.pending_requests() == []  # repaired: no re-request
        assert m.view.statistics().replay_requests == 2  # the start, and the gap


async def test_a_persisting_gap_is_re_requested_after_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = StateViewConfig(replay_retry=RETRY_S)
    async with fake_master(config) as m:
        await m.publish(0, 2)
        assert (await m.next_request()).from_index == 1
        start = trio.current_time()
        assert (await m.next_request()).from_index == 1
        assert trio.current_time() - start == pytest.approx(RETRY_S)
        assert (await m.next_request()).from_index == 1
        assert trio.current_time() - start == pytest.approx(2 * RETRY_S)
        await m.publish(1)
        await m.view.wait_until(lambda s: s.last_index == 2)
        await trio.sleep(3 * RETRY_S)  # virtual time: past 3 more re-requests, had there been any
        assert m.pending_requests() == []


async def test_keeps_asking_until_the_first_event_arrives(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A request sent before the master listened is lost; the view does not wait forever."""
    async with fake_master() as m:
        start = trio.current_time()
        assert (await m.next_request()).from_index == 0
        assert trio.current_time() - start == pytest.approx(RETRY_S)
        await m.publish(0)
        await m.view.wait_until(lambda s: s.last_index == 0)
        await trio.sleep(3 * RETRY_S)  # virtual time: past 3 more requests, had there been any
        assert m.pending_requests() == []


async def test_early_events_beyond_the_buffer_come_back_with_the_replay(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with fake_master(StateViewConfig(max_pending=2)) as m:
        await m.publish(0, 2, 3, 4, 5)
        assert (await m.next_request()).from_index == 1
        await m.publish(1)
        await m.view.wait_until(lambda s: s.last_index == 3)
        assert m.view.statistics().overflowed == 2
        # Still missing 4: asked again after the timeout, and the replay completes it.
        assert (await m.next_request()).from_index == 4
        await m.publish(4, 5)
        assert await m.view.wait_until(lambda s: s.last_index == 5) == expected(6)


async def test_events_of_other_sessions_are_dropped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with fake_master() as m:
        other = Session(0, NodeId("old-master"))
        await m.router.publish(Topic.GLOBAL_EVENTS, event(0, other))
        await m.publish(0)
        await m.view.wait_until(lambda s: s.last_index == 0)
        assert m.view.state == expected(1)
        assert m.view.statistics().foreign_dropped == 1


async def test_malformed_payloads_are_dropped_with_a_log_line(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trexo.worker.state_view")
    async with fake_master() as m:
        await m.router.publish(Topic.GLOBAL_EVENTS, {"index": 0})
        await m.router.publish(Topic.GLOBAL_EVENTS, NodeUpdated(NodeInfo(ME, "h", 1, 1)))
        await m.publish(0)
        await m.view.wait_until(lambda s: s.last_index == 0)
        assert m.view.statistics().payloads_dropped == 2
    messages = [r.getMessage() for r in caplog.records]
    assert any("dropped a dict payload on global_events" in m for m in messages)
    assert any("dropped a NodeUpdated payload" in m for m in messages)


async def test_an_unreachable_master_is_retried(autojump_clock: trio.testing.MockClock) -> None:
    router = Router(ME)
    far = Session(1, NodeId("far-master"))
    sent: list[Envelope] = []

    class Link:
        local_host = "127.0.0.1"

        async def send_envelope(self, envelope: Envelope) -> None:
            sent.append(envelope)

    with trio.fail_after(BOUND_S):
        async with trio.open_nursery() as nursery:
            view = await nursery.start(StateView(router, far).run)
            await trio.sleep(RETRY_S / 2)  # virtual time: between the first request and a retry
            assert view.statistics().replay_requests == 1  # sent into the void, no crash
            router.attach_link(far.master_id, Link())
            await trio.sleep(RETRY_S)  # virtual time: past the retry, before the next one
            assert [e.payload.from_index for e in sent] == [0]
            assert sent[0].topic is Topic.COMMANDS
            nursery.cancel_scope.cancel()


async def test_wait_state_change_wakes_on_the_next_change(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with fake_master() as m:
        woken: list[State] = []

        async def waiter() -> None:
            woken.append(await m.view.wait_state_change(m.view.state.last_index))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert woken == []
            await m.publish(0)
        assert woken == [expected(1)]
        # Already past the index: returns at once.
        assert await m.view.wait_state_change(-1) == expected(1)


# --- the service, against a real master ----------------------------------------------------


async def test_a_late_joining_view_catches_up_from_zero(tmp_path: Path) -> None:
    router = Router(ME)
    with trio.fail_after(BOUND_S):
        async with trio.open_nursery() as nursery:
            master = await nursery.start(Master(router, SESSION, tmp_path).run)
            for k in range(10):
                await router.publish(Topic.LOCAL_EVENTS, NodeReport(NodeInfo(ME, f"h{k}", 100, k)))
            early = await nursery.start(StateView(router, SESSION).run)
            await early.wait_until(lambda s: s.last_index == 10)  # 0 is SessionOpened
            late = await nursery.start(StateView(router, SESSION).run)
            state = await late.wait_until(lambda s: s.last_index == 10)
            assert state == master.state == early.state
            nursery.cancel_scope.cancel()


async def test_views_of_a_real_master_converge_despite_a_lost_event(tmp_path: Path) -> None:
    """Drop one broadcast on its way to the view: the next event reveals the gap."""
    router = Router(ME)
    real_deliver = router.deliver
    dropped: list[int] = []

    async def lossy_deliver(envelope: Envelope) -> None:
        payload = envelope.payload
        if isinstance(payload, IndexedEvent) and payload.index == 3 and not dropped:
            dropped.append(payload.index)
            return
        await real_deliver(envelope)

    router.deliver = lossy_deliver  # type: ignore[method-assign]
    with trio.fail_after(BOUND_S):
        async with trio.open_nursery() as nursery:
            master = await nursery.start(Master(router, SESSION, tmp_path).run)
            view = await nursery.start(StateView(router, SESSION).run)
            for k in range(6):
                await router.publish(Topic.LOCAL_EVENTS, NodeReport(NodeInfo(ME, f"h{k}", 100, k)))
            state = await view.wait_until(lambda s: s.last_index == 5)
            assert dropped == [3]
            assert state == master.state
            assert view.statistics().replay_requests >= 2
            nursery.cancel_scope.cancel()


# --- snapshots -----------------------------------------------------------------------------


def snapshot(index: int) -> StateSnapshot:
    return StateSnapshot(SESSION, index, expected(index + 1))


async def test_a_snapshot_takes_the_view_past_its_gap() -> None:
    async with fake_master() as m:
        await m.publish(0, 1, 11)  # 11 waits behind a gap
        await m.view.wait_until(lambda s: s.last_index == 1)
        await m.router.publish(Topic.GLOBAL_EVENTS, snapshot(9))
        await m.publish(10)
        state = await m.view.wait_until(lambda s: s.last_index == 11)
        assert state == expected(12)
        assert m.view.statistics().snapshots_applied == 1


async def test_a_view_ahead_of_a_snapshot_ignores_it() -> None:
    async with fake_master() as m:
        await m.publish(*range(6))
        await m.view.wait_until(lambda s: s.last_index == 5)
        await m.router.publish(Topic.GLOBAL_EVENTS, snapshot(3))
        await m.publish(6)
        assert await m.view.wait_until(lambda s: s.last_index == 6) == expected(7)
        assert m.view.statistics().snapshots_applied == 0


async def test_a_late_joiner_catches_up_from_the_masters_snapshot(tmp_path: Path) -> None:
    router = Router(ME)
    config = MasterConfig(snapshot_every_events=4)
    with trio.fail_after(BOUND_S):
        async with trio.open_nursery() as nursery:
            master = await nursery.start(Master(router, SESSION, tmp_path, config=config).run)
            for k in range(10):
                await router.publish(Topic.LOCAL_EVENTS, NodeReport(NodeInfo(ME, f"h{k}", 100, k)))
            early = await nursery.start(StateView(router, SESSION).run)
            await early.wait_until(lambda s: s.last_index == 10)  # the master has done all
            late = await nursery.start(StateView(router, SESSION).run)
            state = await late.wait_until(lambda s: s.last_index == 10)
            assert state == master.state == early.state
            assert late.statistics().snapshots_applied == 1
            stats = master.statistics()
            assert stats.snapshot_index == 7 and stats.events_in_memory == 3
            nursery.cancel_scope.cancel()
