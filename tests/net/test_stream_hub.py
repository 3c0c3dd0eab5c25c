"""The stream hub takes each item only from the node entitled to send it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from trexo.net.router import Envelope, Router
from trexo.net.stream_hub import StreamHub
from trexo.net.topics import Topic
from trexo.types.chunks import Chunk
from trexo.types.ids import NodeId, RequestId
from trexo.types.stream import CommandReply, StreamChunk, StreamFailed

ME, LEAD, MASTER, ROGUE = (NodeId(n) for n in ("me", "lead", "master", "rogue"))
RID = RequestId("r1")
BOUND_S = 5.0


@asynccontextmanager
async def running_hub() -> AsyncIterator[tuple[Router, StreamHub]]:
    router = Router(ME)
    with trio.fail_after(BOUND_S):
        async with trio.open_nursery() as nursery:
            hub = await nursery.start(StreamHub(router, master=lambda: MASTER).run)
            yield router, hub
            nursery.cancel_scope.cancel()


async def deliver(router: Router, sender: NodeId, item: object) -> None:
    await router.deliver(Envelope(Topic.STREAM, sender, item))
    await trio.testing.wait_all_tasks_blocked()


def taken(channel: trio.MemoryReceiveChannel[object]) -> list[object]:
    found = []
    while True:
        try:
            found.append(channel.receive_nowait())
        except trio.WouldBlock:
            return found


def piece(text: str) -> StreamChunk:
    return StreamChunk(Chunk(RID, text))


async def test_chunks_come_only_from_the_lead_once_it_is_known(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trexo.net.stream_hub")
    async with running_hub() as (router, hub):
        with hub.expect_stream(RID) as events:
            await deliver(router, LEAD, piece("early"))  # nobody named the lead yet
            hub.stream_from(RID, LEAD)
            await deliver(router, ROGUE, piece("INJECTED"))
            await deliver(router, MASTER, piece("INJECTED"))  # the master sends no chunks
            await deliver(router, ROGUE, StreamFailed(RID, "INJECTED"))
            await deliver(router, LEAD, piece("yes"))
            await deliver(router, MASTER, StreamFailed(RID, "its lead left"))
            assert taken(events) == [piece("yes"), StreamFailed(RID, "its lead left")]
    assert hub.dropped == 4
    lines = [r.getMessage() for r in caplog.records]
    assert any("dropped a StreamChunk on the stream topic from rogue" in line for line in lines)


async def test_a_reply_comes_only_from_a_node_the_command_went_to() -> None:
    async with running_hub() as (router, hub):
        with hub.expect_reply("c1") as replies:
            await deliver(router, ROGUE, CommandReply("c1", "INJECTED"))
            await deliver(router, MASTER, CommandReply("c1", "not sent there yet"))
            hub.sent_to("c1", MASTER)
            await deliver(router, MASTER, CommandReply("c1", result_id="ok"))
            assert taken(replies) == [CommandReply("c1", result_id="ok")]
    assert hub.dropped == 2


async def test_failing_a_stream_locally_needs_no_sender() -> None:
    async with running_hub() as (_, hub):
        with hub.expect_stream(RID) as events:
            hub.fail_stream(RID, "lost")
            [failed] = taken(events)
            assert isinstance(failed, StreamFailed) and failed.message == "lost"
