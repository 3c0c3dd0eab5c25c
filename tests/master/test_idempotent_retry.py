"""A placement answered 503 ("no master answered, retry") may still be carried out: its
retry under the same idempotency key is answered from it, never placed twice.

A real master, state view, stream hub and `ClusterClient` on one in-process router; the
master is made slow the way a busy disk makes it, by holding every thread of its event log.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio

from tests.waiting import wait_until
from trexo.cluster_client import ClusterClient, SessionTracker
from trexo.errors import IdempotencyKeyReused, NoSession
from trexo.master.service import Master
from trexo.net.router import Router
from trexo.net.stream_hub import StreamHub
from trexo.net.topics import Topic
from trexo.thread_pools import limiter
from trexo.types.events import TaskCreated, TaskFinished
from trexo.types.generation import ChatMessage, GenerationRequest
from trexo.types.ids import InstanceId, NodeId, RequestId
from trexo.types.local_events import NodeReport, RunnerReport
from trexo.types.models import ModelRef
from trexo.types.runner_status import RunnerReady
from trexo.types.session import Session
from trexo.types.state import NodeInfo
from trexo.worker.state_view import StateView

BOUND_S = 20.0
COMMAND_WAIT_S = 0.5
MiB = 1024 * 1024
ME = NodeId("me")
SESSION = Session(1, ME)
SMALL = ModelRef("trexo-demo-small", "demo:small", 80 * MiB)


@attrs.define
class Node:
    router: Router
    master: Master
    client: ClusterClient

    async def carried_out(self, count: int) -> list[InstanceId]:
        """The instances, once the master has placed `count` of them."""
        await wait_until(
            lambda: len(self.master.state.instances) >= count,
            timeout=BOUND_S,
            what=f"{count} instances placed",
        )
        return list(self.master.state.instances)


@asynccontextmanager
async def one_node(tmp_path: Path) -> AsyncIterator[Node]:
    router = Router(ME)
    with trio.fail_after(BOUND_S * 2):
        async with trio.open_nursery() as nursery:
            master = await nursery.start(Master(router, SESSION, tmp_path).run)
            view = await nursery.start(StateView(router, SESSION).run)
            sessions = SessionTracker()
            hub = StreamHub(router, master=lambda: ME)
            await nursery.start(hub.run)
            client = ClusterClient(router, hub, sessions, lambda: [], command_wait=COMMAND_WAIT_S)
            sessions.set_session(SESSION, view)
            await router.send(ME, Topic.LOCAL_EVENTS, NodeReport(NodeInfo(ME, "h", 2**32, 2**31)))
            await view.wait_until(lambda s: s.opened and bool(s.nodes))
            yield Node(router, master, client)
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def slow_disk() -> AsyncIterator[None]:
    """Every event-log thread held: the master blocks on its next write until the block ends."""
    log_threads = limiter("event_log")
    holders = [object() for _ in range(int(log_threads.total_tokens))]
    for holder in holders:  # a write in flight ends within the test's bound
        await log_threads.acquire_on_behalf_of(holder)
    try:
        yield
    finally:
        for holder in holders:
            log_threads.release_on_behalf_of(holder)


async def test_a_retry_under_the_key_of_a_503_places_once(tmp_path: Path) -> None:
    async with one_node(tmp_path) as node:
        async with slow_disk():
            with pytest.raises(NoSession, match="no master answered"):
                await node.client.place_model(SMALL, idempotency_key="k1")
        # The first attempt is carried out after all, once the master gets to it.
        (placed,) = await node.carried_out(1)
        again = await node.client.place_model(SMALL, idempotency_key="k1")
        assert again == placed
        assert list(node.master.state.instances) == [placed]


async def test_without_a_key_the_same_retry_places_twice(tmp_path: Path) -> None:
    # Why the API gives every placement a key: the setup above, unkeyed, is the defect.
    async with one_node(tmp_path) as node:
        async with slow_disk():
            with pytest.raises(NoSession):
                await node.client.place_model(SMALL)
        await node.carried_out(1)
        await node.client.place_model(SMALL)
        assert len(node.master.state.instances) == 2


async def test_a_deletion_retried_under_its_key_is_answered_as_done(tmp_path: Path) -> None:
    async with one_node(tmp_path) as node:
        placed = await node.client.place_model(SMALL)
        async with slow_disk():
            with pytest.raises(NoSession):
                await node.client.delete_instance(placed, idempotency_key="d1")
        await wait_until(
            lambda: not node.master.state.instances, timeout=BOUND_S, what="the deletion"
        )
        # Not "no such instance": the retry learns its deletion was done.
        await node.client.delete_instance(placed, idempotency_key="d1")


async def test_a_key_reused_for_another_placement_is_refused(tmp_path: Path) -> None:
    async with one_node(tmp_path) as node:
        await node.client.place_model(SMALL, idempotency_key="k1")
        other = attrs.evolve(SMALL, model_id="another-model")
        with pytest.raises(IdempotencyKeyReused):
            await node.client.place_model(other, idempotency_key="k1")
        assert len(node.master.state.instances) == 1


async def test_a_chat_answered_503_is_cancelled_behind_it_not_left_pending(
    tmp_path: Path,
) -> None:
    async with one_node(tmp_path) as node:
        placed = await node.client.place_model(SMALL)
        runner = node.master.state.instances[placed].lead.runner_id
        await node.router.send(ME, Topic.LOCAL_EVENTS, RunnerReport(runner, placed, RunnerReady()))
        await wait_until(
            lambda: node.master.state.runners[runner].status == RunnerReady(),
            timeout=BOUND_S,
            what="the runner ready",
        )
        request = GenerationRequest(RequestId("chat-1"), messages=(ChatMessage("user", "hi"),))
        with node.router.subscribe(Topic.GLOBAL_EVENTS) as events:
            async with slow_disk():
                with pytest.raises(NoSession):
                    async with node.client.open_generation(SMALL.model_id, request):
                        raise AssertionError("the master answered")
            # The master takes the chat from its queue after all, then the cancel behind it.
            seen: list[object] = []
            with trio.fail_after(BOUND_S):
                async for envelope in events:
                    event = getattr(envelope.payload, "event", None)
                    seen.append(event)
                    if isinstance(event, TaskFinished):
                        break
        assert TaskCreated in {type(e) for e in seen}
        assert seen[-1] == TaskFinished(RequestId("chat-1"), "cancelled")
        assert not node.master.state.tasks
