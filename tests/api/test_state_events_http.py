"""`GET /state/events` over real HTTP: the cluster now, then every change, across elections,
coalesced, kept alive, and bounded in how many clients it serves."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import pytest
import trio

from tests.waiting import NotYet, wait_until
from trexo.config import ApiConfig
from trexo.types.ids import NodeId
from trexo.types.session import Session
from trexo.types.state import State
from trexo.wire import converter

from .conftest import KEEPALIVE_S
from .fake_node import NODE_ID, OTHER, FakeNode

TEST_TIMEOUT_S = 30.0
RELEASE_BOUND_S = 10.0
"""Generous: the server sees a client gone, and frees its place, in milliseconds."""


@pytest.fixture
def api_config(request: pytest.FixtureRequest) -> ApiConfig:
    """The conftest's config, with what a test asks for (`indirect` parametrization)."""
    overrides: dict[str, Any] = getattr(request, "param", {})
    return ApiConfig(port=0, keepalive_interval=KEEPALIVE_S, **overrides)


class EventReader:
    """The events of one `/state/events` response, read as they arrive."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._lines = response.aiter_lines()

    async def block(self) -> list[str]:
        """The lines of the next event or comment (up to its blank line)."""
        lines: list[str] = []
        while True:
            line = await anext(self._lines)
            if line:
                lines.append(line)
            elif lines:
                return lines

    async def event(self) -> dict[str, Any]:
        """The next `data:` event, decoded (comments and `retry:` skipped)."""
        while True:
            data = [
                line.removeprefix("data: ") for line in await self.block() if line[:6] == "data: "
            ]
            if data:
                decoded: dict[str, Any] = json.loads("".join(data))
                return decoded


@asynccontextmanager
async def following(http: httpx.AsyncClient) -> AsyncIterator[EventReader]:
    async with http.stream("GET", "/state/events") as response:
        assert response.status_code == 200
        yield EventReader(response)


async def test_the_first_event_is_the_cluster_now(http: httpx.AsyncClient, node: FakeNode) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with following(http) as events:
            assert events.response.headers["content-type"].startswith("text/event-stream")
            assert events.response.headers["cache-control"] == "no-cache"
            assert await events.block() == ["retry: 1000"]
            event = await events.event()
    assert event["node_id"] == NODE_ID
    assert event["session"] == {"clock": 1, "master_id": NODE_ID}
    # The fake's instance has no runner record: it is starting, so it cannot serve yet.
    [(instance_id, availability)] = event["availability"].items()
    assert availability == {
        "serving": False,
        "reason": "runner runner-0 on node fake-nod is starting",
    }
    assert event["status"] == "degraded"
    assert event["problems"] == [f"instance {instance_id} (demo-tiny): {availability['reason']}"]
    assert event["state"] == converter.unstructure(node.current_state(), State)
    assert event["state"] == (await http.get("/state")).json()


async def test_a_placement_is_sent_at_once(http: httpx.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with following(http) as events:
            before = await events.event()
            placed = await http.post("/instances", json={"model": OTHER.model_id})
            assert placed.status_code == 201
            after = await events.event()
    instance_id = placed.json()["instance_id"]
    assert instance_id not in before["state"]["instances"]
    assert after["state"]["instances"][instance_id]["model"]["model_id"] == OTHER.model_id


async def test_silence_is_kept_alive(http: httpx.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with following(http) as events:
            await events.event()
            start = trio.current_time()
            assert await events.block() == [": keep-alive"]
            assert trio.current_time() - start >= KEEPALIVE_S * 0.9


async def test_the_stream_follows_an_election(http: httpx.AsyncClient, node: FakeNode) -> None:
    """The same response goes on while the node elects a new master and follows it."""
    new_master = NodeId("other-node")
    with trio.fail_after(TEST_TIMEOUT_S):
        async with following(http) as events:
            await events.event()
            node.session = None
            electing = await events.event()
            node.session = Session(2, new_master)
            elected = await events.event()
    assert (electing["session"], electing["status"]) == (None, "electing")
    assert elected["session"] == {"clock": 2, "master_id": new_master}


@pytest.mark.parametrize("api_config", [{"events_min_interval": 1.0}], indirect=True)
async def test_a_burst_of_changes_is_sent_as_its_last_state(
    http: httpx.AsyncClient, node: FakeNode
) -> None:
    """After an event the stream waits `events_min_interval`; what changed meanwhile goes
    out as one event with the newest state."""
    with trio.fail_after(TEST_TIMEOUT_S):
        async with following(http) as events:
            first = await events.event()
            last_index = node.state.last_index
            for _ in range(20):
                last_index += 1
                node.state = attrs.evolve(node.state, last_index=last_index)
                await trio.lowlevel.checkpoint()
            start = trio.current_time()
            second = await events.event()
            waited = trio.current_time() - start
    assert first["state"]["last_index"] == last_index - 20
    assert second["state"]["last_index"] == last_index
    assert waited > 0.5  # held back for the rest of the interval


@pytest.mark.parametrize("api_config", [{"max_event_streams": 2}], indirect=True)
async def test_streams_are_bounded_and_a_closed_one_frees_its_place(
    http: httpx.AsyncClient,
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with following(http) as first:
            await first.event()
            async with following(http) as second:
                await second.event()
                refused = await http.get("/state/events")
                assert refused.status_code == 503
                assert refused.headers["retry-after"] == "1"
                assert refused.json()["error"]["code"] == "too_many_event_streams"
            # The second client left: its place is released once the server sees it gone.
            await wait_until(
                lambda: a_stream_opens(http),
                timeout=RELEASE_BOUND_S,
                what="a third stream to get the second one's place",
            )


async def a_stream_opens(http: httpx.AsyncClient) -> bool | NotYet:
    """Whether `/state/events` serves a new client now (it reads the first event)."""
    async with http.stream("GET", "/state/events") as response:
        if response.status_code != 200:
            return NotYet((response.status_code, await response.aread()))
        await EventReader(response).event()
        return True
