"""The election service over real routers linked in-process, in virtual time."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from tests.waiting import NotYet, wait_until
from trexo.config import ElectionConfig
from trexo.election import Election
from trexo.election.clock_store import CLOCK_FILE, load_clock
from trexo.net.router import Envelope, Router
from trexo.net.topics import Topic
from trexo.types.ids import NodeId
from trexo.types.session import Session

from .memory_links import MemoryNetwork

CONFIG = ElectionConfig(boot_grace=0.3, campaign_window=0.5)
POLL_S = 0.001
"""How often `converged` checks, in virtual time: fine enough to time a decision by it."""
WAIT_S = 5.0


@attrs.define
class Member:
    router: Router
    data_dir: Path
    election: Election | None = None
    sessions: list[Session] = attrs.field(factory=list)
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)

    @property
    def node_id(self) -> NodeId:
        return self.router.node_id

    @property
    def session(self) -> Session | None:
        return self.election.session if self.election is not None else None

    @property
    def is_master(self) -> bool:
        session = self.session
        return session is not None and session.master_id == self.node_id


class Harness:
    def __init__(self, nursery: trio.Nursery, tmp_path: Path) -> None:
        self.nursery = nursery
        self.tmp_path = tmp_path
        self.net = MemoryNetwork()
        self.nodes: dict[str, Member] = {}

    def node(self, name: str) -> Member:
        if name not in self.nodes:
            self.nodes[name] = Member(Router(NodeId(name)), self.tmp_path / name)
        return self.nodes[name]

    async def start(
        self, name: str, *, force_master: bool = False, commands_seen: int = 0
    ) -> Member:
        node = self.node(name)
        node.scope = trio.CancelScope()
        node.sessions = []
        send, receive = trio.open_memory_channel[Session](math.inf)
        election = Election(
            node.router,
            node.data_dir,
            send,
            config=CONFIG,
            commands_seen=lambda: commands_seen,
            force_master=force_master,
        )
        node.election = election

        async def run(*, task_status: trio.TaskStatus[None]) -> None:
            with node.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(collect, receive, node.sessions)
                    await nursery.start(election.run)
                    task_status.started()

        await self.nursery.start(run)
        return node

    def stop(self, name: str) -> None:
        """Kill the node: its election ends and every link it had goes down."""
        node = self.nodes[name]
        node.scope.cancel()
        self.net.isolate(node.router)

    def mesh(self, *names: str) -> None:
        self.net.mesh(*(self.node(n).router for n in names))

    def connect(self, a: str, b: str) -> None:
        self.net.connect(self.node(a).router, self.node(b).router)

    def group(self, *names: str) -> list[Member]:
        return [self.nodes[n] for n in names]


async def collect(receive: trio.MemoryReceiveChannel[Session], into: list[Session]) -> None:
    async for session in receive:
        into.append(session)


@asynccontextmanager
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    async with trio.open_nursery() as nursery:
        yield Harness(nursery, tmp_path)
        nursery.cancel_scope.cancel()


def agreed(nodes: list[Member]) -> Session | None:
    """The session all `nodes` hold (and handed on), with exactly one of them master."""
    handed_on = {n.sessions[-1] if n.sessions else None for n in nodes}
    sessions = {n.session for n in nodes} | handed_on
    if len(sessions) != 1:
        return None
    (session,) = sessions
    if session is None or sum(n.is_master for n in nodes) != 1:
        return None
    return session


async def converged(nodes: list[Member]) -> Session:
    def check() -> Session | NotYet:
        return agreed(nodes) or NotYet({n.node_id: n.session for n in nodes})

    names = ", ".join(n.node_id for n in nodes)
    session = await wait_until(check, timeout=WAIT_S, what=f"{names} agreed", poll=POLL_S)
    assert isinstance(session, Session)
    return session


async def test_three_nodes_boot_and_converge_on_one_master(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with harness(tmp_path) as h:
        h.mesh("a", "b", "c")
        t0 = trio.current_time()
        for name in "abc":
            await h.start(name)
        session = await converged(h.group("a", "b", "c"))
        assert session == Session(1, NodeId("c"))
        assert trio.current_time() - t0 == pytest.approx(CONFIG.boot_grace, abs=0.01)
        for node in h.group("a", "b", "c"):
            assert node.sessions == [session]  # one decision each, handed on once
            assert load_clock(node.data_dir) == 1
            assert node.election is not None
            stats = node.election.statistics()
            assert stats.rounds == 1
            assert stats.last_decision_latency == 0.0


async def test_detaching_the_master_elects_a_new_one_at_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with harness(tmp_path) as h:
        h.mesh("a", "b", "c")
        for name in "abc":
            await h.start(name)
        first = await converged(h.group("a", "b", "c"))
        assert first.master_id == NodeId("c")
        lost_at = trio.current_time()
        h.net.isolate(h.node("c").router)
        second = await converged(h.group("a", "b"))
        assert trio.current_time() - lost_at <= 2 * POLL_S  # every peer answered at once
        assert second == Session(2, NodeId("b"))
        for node in h.group("a", "b"):
            assert node.sessions == [first, second]
            assert node.election is not None
            assert node.election.statistics().last_decision_latency == 0.0
        # The cut-off master is alone; it has no one to lose and stays master of its own.
        assert h.node("c").session == first


@pytest.mark.parametrize("links_first", [True, False], ids=["linked-at-start", "linked-later"])
async def test_a_fourth_node_joining_changes_neither_master_nor_clock(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, links_first: bool
) -> None:
    async with harness(tmp_path) as h:
        h.mesh("a", "b", "c")
        for name in "abc":
            await h.start(name)
        before = await converged(h.group("a", "b", "c"))
        await trio.sleep(1.0)
        if links_first:
            for other in "abc":
                h.connect("d", other)
            await h.start("d")
        else:
            await h.start("d")
            await trio.sleep(CONFIG.boot_grace / 2)
            for other in "abc":
                h.connect("d", other)
        assert await converged(h.group("a", "b", "c", "d")) == before
        # Nothing else happens (virtual time): 2 s is past any boot grace or campaign window
        # a node could have opened, so a round, had one started, would have decided.
        await trio.sleep(2.0)
        for node in h.group("a", "b", "c"):
            assert node.sessions == [before]
            assert node.election is not None
            assert node.election.statistics().rounds == 1
        d = h.node("d")
        assert d.sessions == [before]
        assert d.election is not None
        assert d.election.statistics().rounds == 0
        assert load_clock(d.data_dir) == before.clock


async def test_a_healed_partition_merges_into_one_master(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with harness(tmp_path) as h:
        h.mesh("a", "b")
        h.mesh("c", "d")
        for name in "abcd":
            await h.start(name)
        left = await converged(h.group("a", "b"))
        right = await converged(h.group("c", "d"))
        assert left.master_id == NodeId("b")
        assert right.master_id == NodeId("d")
        await trio.sleep(1.0)
        for x in "ab":
            for y in "cd":
                h.connect(x, y)
        merged = await converged(h.group("a", "b", "c", "d"))
        assert merged.clock == max(left.clock, right.clock) + 1
        assert merged.master_id == NodeId("d")
        assert h.node("b").sessions == [left, merged]  # the losing master demoted itself


async def test_the_persisted_clock_survives_a_restart(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with harness(tmp_path) as h:
        await h.start("a")
        assert await converged(h.group("a")) == Session(1, NodeId("a"))
        h.stop("a")
        await trio.sleep(0.1)
        assert (h.node("a").data_dir / CLOCK_FILE).read_text() == "1\n"
        await h.start("a")  # a new Election on the same data directory
        assert await converged(h.group("a")) == Session(2, NodeId("a"))
        assert load_clock(h.node("a").data_dir) == 2


async def test_a_restarted_node_that_lost_its_clock_adopts_the_cluster_session(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with harness(tmp_path) as h:
        h.mesh("a", "b", "c")
        for name in "abc":
            await h.start(name)
        first = await converged(h.group("a", "b", "c"))
        h.stop("c")  # the master
        second = await converged(h.group("a", "b"))
        assert second.clock == 2
        (h.node("c").data_dir / CLOCK_FILE).unlink()  # the exo #2197 case: back with clock 0
        await trio.sleep(1.0)
        h.mesh("c", "a")
        h.connect("c", "b")
        await h.start("c")
        assert await converged(h.group("a", "b", "c")) == second
        assert h.node("c").sessions == [second]
        assert load_clock(h.node("c").data_dir) == 2
        assert h.node("a").sessions == [first, second]


async def test_force_master_wins_over_a_senior_cluster(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with harness(tmp_path) as h:
        h.mesh("a", "b", "z")
        await h.start("a", force_master=True)
        await h.start("b", commands_seen=100)
        await h.start("z")
        assert (await converged(h.group("a", "b", "z"))).master_id == NodeId("a")


async def test_malformed_messages_are_dropped_with_a_log_line(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trexo.election")
    async with harness(tmp_path) as h:
        node = await h.start("a")
        await node.router.deliver(Envelope(Topic.ELECTION, NodeId("x"), {"type": "Bogus"}))
        assert await converged(h.group("a")) == Session(1, NodeId("a"))
        messages = [r.getMessage() for r in caplog.records]
        assert any("dropped election message from x" in m for m in messages)
        assert any("campaign for clock 1 (boot)" in m for m in messages)
        assert any("session 1: master is a (decided among 1 candidates" in m for m in messages)


async def test_run_closes_the_sessions_channel_when_it_ends(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    send, receive = trio.open_memory_channel[Session](math.inf)
    election = Election(Router(NodeId("a")), tmp_path, send, config=CONFIG)
    assert election.statistics().rounds == 0
    with trio.move_on_after(1.0):
        await election.run()
    assert await receive.receive() == Session(1, NodeId("a"))
    with pytest.raises(trio.EndOfChannel):
        await receive.receive()
