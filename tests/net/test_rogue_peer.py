"""A rogue peer (one that holds whatever the cluster requires to link, here nothing) built
from trexo's own handshake and sealing, against an in-process cluster of three nodes on
127.0.0.1: m runs the master, o serves a user (a `ClusterClient` with its `StreamHub` and
`StateView`), l leads the model's only runner (the test plays that runner by hand).

The rogue reads what the cluster tells every node (the master broadcasts every task's id)
and speaks for others: as the master, as the lead of someone else's generation, as other
nodes. Each such message is dropped with a log line; the user's stream is unchanged, the
state stays the master's, and the master answers commands throughout.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from tests.waiting import NotYet, wait_until
from trexo.cluster_client import ClusterClient, SessionTracker
from trexo.master.service import Master
from trexo.net.codec import decode_message, encode_envelope
from trexo.net.router import Envelope
from trexo.net.stream_hub import StreamHub
from trexo.net.topics import Topic
from trexo.types.chunks import Chunk
from trexo.types.commands import CancelTask, PlaceInstance, SubmitTask
from trexo.types.downloads import DownloadPhase, DownloadProgress
from trexo.types.events import IndexedEvent, NodeUpdated, TaskCreated
from trexo.types.generation import ChatMessage, GenerationRequest
from trexo.types.ids import InstanceId, NodeId, RequestId, new_id
from trexo.types.local_events import (
    DownloadReport,
    NodeReport,
    RankAddressReport,
    RunnerReport,
    TaskInFlight,
    TaskReport,
)
from trexo.types.models import ModelRef
from trexo.types.runner_status import RunnerFailed, RunnerReady
from trexo.types.session import Session
from trexo.types.snapshot import StateSnapshot
from trexo.types.state import NodeInfo, State, Task
from trexo.types.stream import CommandReply, StreamChunk, StreamFailed, TaskBody
from trexo.worker.state_view import StateView

from .helpers import TEST_TIMEOUT_S, SealedPeer, fake_peer, logged, start_node, wait_peers

GiB = 1024**3
PiB = 1024**5
M, ORIGIN, L, X = (NodeId(n) for n in ("m", "o", "l", "x"))
SESSION = Session(1, M)
SMALL = ModelRef("trexo-demo-small", "demo:small", 80 * 1024 * 1024)
WAIT_S = 5.0


def info(node_id: NodeId, available: int = 2 * GiB) -> NodeInfo:
    return NodeInfo(node_id, f"host-{node_id}", 2 * available, available)


class Rogue:
    """The rogue's end of its links: sends any envelope as itself, and keeps everything the
    nodes tell it (it must read, or its links would close on missed heartbeats)."""

    def __init__(self) -> None:
        self.links: dict[NodeId, SealedPeer] = {}
        self.heard: list[Any] = []

    async def send(self, to: NodeId, topic: Topic, payload: object) -> None:
        await self.links[to].send_message(encode_envelope(Envelope(topic, X, payload)))

    async def read(self, peer: NodeId, link: SealedPeer) -> None:
        while True:
            item = decode_message(await link.get_message(), sender=peer, max_bytes=1 << 24)
            if isinstance(item, Envelope):
                self.heard.append(item.payload)

    def task_ids(self) -> list[RequestId]:
        """Every task id the master has broadcast to the rogue."""
        return [
            e.event.task.task_id
            for e in self.heard
            if isinstance(e, IndexedEvent) and isinstance(e.event, TaskCreated)
        ]


@attrs.define
class Cluster:
    master: Master
    view: StateView
    client: ClusterClient
    hub: StreamHub
    rogue: Rogue
    lead_router: Any
    bodies: trio.MemoryReceiveChannel[Envelope]
    at_origin: list[Envelope]
    """What reached o from the rogue, on the topics o's services take."""
    instance_id: InstanceId | None = None

    @property
    def state(self) -> State:
        return self.master.state

    async def converged(self) -> State:
        """The view's state, once it is the master's (a bounded wait: it may never be)."""

        def check() -> State | NotYet:
            state = self.view.state
            return state if state == self.master.state else NotYet(state.last_index)

        return await wait_until(check, timeout=WAIT_S, what="o's view equal to the master's")

    async def reached_origin(self, count: int) -> None:
        """Until `count` of the rogue's messages have reached o's services."""
        await wait_until(
            lambda: len(self.at_origin) >= count, timeout=WAIT_S, what="the rogue's messages at o"
        )

    async def place(self) -> None:
        """Place the model on l and have l report its runner ready."""
        instance_id = self.instance_id = await self.client.place_model(SMALL, (L,))
        runner = self.state.instances[instance_id].lead.runner_id
        await self.lead_router.send(
            M, Topic.LOCAL_EVENTS, RunnerReport(runner, instance_id, RunnerReady())
        )
        await self.view.wait_until(
            lambda s: runner in s.runners and s.runners[runner].status == RunnerReady()
        )


@asynccontextmanager
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    with trio.fail_after(TEST_TIMEOUT_S * 3):
        async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
            m = await start_node(nursery, "m")
            o = await start_node(nursery, "o")
            lead = await start_node(nursery, "l")
            await o.connect(m)
            await lead.connect(m)
            await lead.connect(o)
            await wait_peers(m.router, ["o", "l"])
            master = await nursery.start(Master(m.router, SESSION, tmp_path).run)
            view = await nursery.start(StateView(o.router, SESSION).run)
            sessions = SessionTracker()
            hub = StreamHub(
                o.router, master=lambda: sessions.session.master_id if sessions.session else None
            )
            await nursery.start(hub.run)
            client = ClusterClient(o.router, hub, sessions, lambda: [])
            sessions.set_session(SESSION, view)
            rogue = Rogue()
            for target in (m, o, lead):
                link = await stack.enter_async_context(fake_peer(target, "x"))
                rogue.links[target.name] = link
                nursery.start_soon(rogue.read, target.name, link)
            for router, node_id in ((o.router, ORIGIN), (lead.router, L)):
                await router.send(M, Topic.LOCAL_EVENTS, NodeReport(info(node_id)))
            await m.router.send(M, Topic.LOCAL_EVENTS, NodeReport(info(M)))
            bodies = stack.enter_context(lead.router.subscribe(Topic.REQUESTS))
            at_origin: list[Envelope] = []
            for topic in (Topic.STREAM, Topic.GLOBAL_EVENTS):
                nursery.start_soon(
                    record_from_rogue, stack.enter_context(o.router.subscribe(topic)), at_origin
                )
            await view.wait_until(lambda s: s.opened and len(s.nodes) == 3)
            yield Cluster(master, view, client, hub, rogue, lead.router, bodies, at_origin)
            nursery.cancel_scope.cancel()


async def record_from_rogue(
    inbox: trio.MemoryReceiveChannel[Envelope], into: list[Envelope]
) -> None:
    # Subscribed after o's own services: what is recorded here reached them first.
    async for envelope in inbox:
        if envelope.sender == X:
            into.append(envelope)


def request(text: str = "hello") -> GenerationRequest:
    return GenerationRequest(
        RequestId(f"chatcmpl-{new_id()}"), messages=(ChatMessage("user", text),)
    )


def chunk(rid: RequestId, text: str, finish: bool = False) -> StreamChunk:
    return StreamChunk(Chunk(rid, text, finish_reason="stop" if finish else None))


# --- the master's events (global_events) ---------------------------------------------------


async def test_a_forged_snapshot_from_a_peer_does_not_freeze_the_state(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with cluster(tmp_path) as c:
        phantom = State(nodes={X: info(X, PiB)}, opened=True)
        await c.rogue.send(ORIGIN, Topic.GLOBAL_EVENTS, StateSnapshot(SESSION, 2**62, phantom))
        index = c.state.last_index + 1
        forged = IndexedEvent(SESSION, index, NodeUpdated(info(X, PiB)))
        await c.rogue.send(ORIGIN, Topic.GLOBAL_EVENTS, forged)
        await c.reached_origin(2)
        # The master's next events still apply: the view follows the master, not the rogue.
        await c.client.command(PlaceInstance(new_id(), SMALL, (L,)))
        state = await c.converged()
        assert X not in state.nodes and state.last_index < 2**62
        assert len(state.instances) == 1
        assert logged(caplog, "dropped", "StateSnapshot", "global_events", "from x")
        assert logged(caplog, "dropped", "IndexedEvent", "global_events", "from x")


# --- streams (chunks and the commands that end them) ---------------------------------------


async def test_a_rogue_cannot_inject_into_or_end_another_users_stream(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with cluster(tmp_path) as c:
        await c.place()
        user = request()
        texts: list[str] = []
        async with c.client.open_generation(SMALL.model_id, user) as stream:
            body = (await c.bodies.receive()).payload
            assert isinstance(body, TaskBody) and body.request == user
            rid = user.request_id
            # The rogue learned the task's id from the master's broadcast; it speaks for l.
            await wait_until(lambda: rid in c.rogue.task_ids(), timeout=WAIT_S, what="the id")
            await c.rogue.send(ORIGIN, Topic.STREAM, chunk(rid, "INJECTED"))
            await c.rogue.send(ORIGIN, Topic.STREAM, chunk(rid, "", finish=True))
            await c.rogue.send(ORIGIN, Topic.STREAM, StreamFailed(rid, "INJECTED failure"))
            await c.rogue.send(M, Topic.COMMANDS, CancelTask(new_id(), rid))
            await c.rogue.send(M, Topic.LOCAL_EVENTS, TaskReport(rid, finish_reason="stop"))
            await c.rogue.send(M, Topic.LOCAL_EVENTS, NodeReport(info(X)))  # its own: a barrier
            await c.reached_origin(3)
            await wait_until(lambda: X in c.state.nodes, timeout=WAIT_S, what="x's reports")
            assert rid in c.state.tasks  # not cancelled, not finished
            # The lead's own chunks are the stream, whole.
            await c.lead_router.send(ORIGIN, Topic.STREAM, chunk(rid, "Hi"))
            await c.lead_router.send(ORIGIN, Topic.STREAM, chunk(rid, " there", finish=True))
            async for piece in stream:
                texts.append(piece.text)
        assert texts == ["Hi", " there"]
        for dropped in ("StreamChunk", "StreamFailed"):
            assert logged(caplog, "dropped", dropped, "from x"), dropped
        assert logged(caplog, "refused CancelTask from x")


async def test_a_rogue_cannot_submit_a_task_in_another_nodes_name(tmp_path: Path) -> None:
    # The rogue cannot submit a task in o's name (its chunks would go to o's user).
    async with cluster(tmp_path) as c:
        await c.place()
        await c.rogue.send(
            M, Topic.COMMANDS, SubmitTask("s1", SMALL.model_id, ORIGIN, RequestId("r"))
        )
        reply = await wait_until(
            lambda: next((p for p in c.rogue.heard if isinstance(p, CommandReply)), None),
            timeout=WAIT_S,
            what="the master's reply to the rogue",
        )
        assert reply.error is not None and "o" in reply.error
        assert RequestId("r") not in c.state.tasks


# --- facts (local_events) --------------------------------------------------------------------


async def test_a_peers_facts_about_other_nodes_are_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with cluster(tmp_path) as c:
        await c.place()
        assert c.instance_id is not None
        runner = c.state.instances[c.instance_id].lead.runner_id
        user = request()
        async with c.client.open_generation(SMALL.model_id, user):
            rid = user.request_id
            facts = [
                NodeReport(NodeInfo(NodeId("phantom"), "phantom", PiB, PiB)),
                NodeReport(info(L, PiB)),
                RunnerReport(runner, c.instance_id, RunnerFailed("INJECTED")),
                RankAddressReport(c.instance_id, runner, 0, "10.9.9.9:1"),
                DownloadReport(
                    L, DownloadProgress(SMALL.model_id, DownloadPhase.FAILED, error="INJECTED")
                ),
                TaskReport(rid, finish_reason="stop"),
                TaskInFlight(Task(RequestId("adopted"), c.instance_id, ORIGIN)),
            ]
            before = c.state
            for fact in facts:
                await c.rogue.send(M, Topic.LOCAL_EVENTS, fact)
            await c.rogue.send(M, Topic.LOCAL_EVENTS, NodeReport(info(X)))  # its own: a barrier
            await wait_until(lambda: X in c.state.nodes, timeout=WAIT_S, what="x's reports")
            after = c.state
            assert {n: i for n, i in after.nodes.items() if n != X} == before.nodes
            assert (after.runners, after.tasks, after.groups, after.downloads) == (
                before.runners,
                before.tasks,
                before.groups,
                before.downloads,
            )
            for fact in facts:
                assert logged(caplog, "dropped", type(fact).__name__, "from x"), fact
            # The master answers commands throughout, and places by the real nodes' memory.
            again = await c.client.place_model(SMALL)
            assert c.state.instances[again].node_ids[0] in (M, ORIGIN, L, X)


async def test_a_peer_may_report_about_itself(tmp_path: Path) -> None:
    # What it says about itself is its own to say (a lie about its memory included).
    async with cluster(tmp_path) as c:
        await c.rogue.send(M, Topic.LOCAL_EVENTS, NodeReport(info(X)))
        await wait_until(lambda: X in c.state.nodes, timeout=WAIT_S, what="x's own report")


async def test_every_node_may_still_place_instances(tmp_path: Path) -> None:
    # Commands that act on the whole cluster stay open to every node (every node's API
    # takes them); only what belongs to one node's user is that node's to ask for.
    async with cluster(tmp_path) as c:
        await c.rogue.send(M, Topic.COMMANDS, PlaceInstance("p1", SMALL, (L,)))
        reply = await wait_until(
            lambda: next((p for p in c.rogue.heard if isinstance(p, CommandReply)), None),
            timeout=WAIT_S,
            what="the master's reply to the rogue",
        )
        assert reply.error is None
