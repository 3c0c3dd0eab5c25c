"""What every generation dialect does alike (`trexo.api.streaming` does it once for them all),
proven over each against a real server: a client that leaves cancels its generation, streamed
or not; `POST /v1/cancel/{id}` ends a stream as a shorter answer; long silences are kept alive
where the format allows it, and only silences.

Each dialect's own shapes (events, errors, its official client) are tested in its own module;
how the dialects differ here is data in `tests.api.dialects`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import httpx
import pytest
import trio

from trexo.config import ApiConfig

from .conftest import SILENCE_S
from .dialects import DIALECTS, KEEPALIVE, Dialect
from .fake_node import HELLO, FakeNode, Step

TEST_TIMEOUT_S = 30.0
CANCEL_BOUND_S = 5.0
"""How soon after a client leaves its generation must have been left: it takes milliseconds;
the bound only catches a generation that goes on."""
QUIET_KEEPALIVE_S = 10.0
"""Longer than a whole scripted stream can take under load, so any keep-alive in it would be
one written without a silence."""

each_dialect = pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)


@pytest.fixture
def api_config(api_config: ApiConfig, request: pytest.FixtureRequest) -> ApiConfig:
    """The conftest's, with the keep-alive interval a test asks for (`indirect`)."""
    interval: float = getattr(request, "param", api_config.keepalive_interval)
    return attrs.evolve(api_config, keepalive_interval=interval)


async def read_until(texts: AsyncIterator[str], marker: str) -> str:
    """What a stream has sent, read up to the first piece holding `marker`."""
    raw = ""
    while marker not in raw:
        raw += await anext(texts)
    return raw


async def assert_left_then_still_serving(
    http: httpx.AsyncClient, node: FakeNode, dialect: Dialect
) -> None:
    """The one generation was cancelled (soon after its client left); the next is served."""
    request_id = node.only_request_id()
    with trio.fail_after(CANCEL_BOUND_S):
        await node.finished[request_id].wait()
    assert node.exits[request_id] == "Cancelled"
    node.script = HELLO
    response = await http.post(dialect.path, json=dialect.body(False))
    assert response.status_code == 200, response.text


@each_dialect
async def test_a_client_leaving_mid_stream_cancels_its_generation(
    api_url: str, http: httpx.AsyncClient, node: FakeNode, dialect: Dialect
) -> None:
    node.script = (Step(text="first"), Step(delay=60.0, text="never", finish="stop"))
    with trio.fail_after(TEST_TIMEOUT_S):
        async with (
            httpx.AsyncClient(base_url=api_url) as leaving,
            leaving.stream("POST", dialect.path, json=dialect.body(True)) as response,
        ):
            await read_until(response.aiter_text(), '"first"')
        # The client has closed its connection.
        await assert_left_then_still_serving(http, node, dialect)


@each_dialect
async def test_a_client_leaving_while_it_waits_cancels_its_generation(
    api_url: str, http: httpx.AsyncClient, node: FakeNode, dialect: Dialect
) -> None:
    node.script = (Step(delay=60.0, text="never", finish="stop"),)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:

            async def impatient_client() -> None:
                async with httpx.AsyncClient(base_url=api_url) as impatient:
                    await impatient.post(dialect.path, json=dialect.body(False))

            nursery.start_soon(impatient_client)
            await node.any_entered.wait()
            nursery.cancel_scope.cancel()  # closes the client's connection
        await assert_left_then_still_serving(http, node, dialect)


@each_dialect
async def test_cancel_by_id_ends_the_stream_as_a_shorter_answer(
    http: httpx.AsyncClient, node: FakeNode, dialect: Dialect
) -> None:
    node.script = (Step(text="so far"), Step(delay=60.0, text="never", finish="stop"))
    with trio.fail_after(TEST_TIMEOUT_S):
        async with http.stream("POST", dialect.path, json=dialect.body(True)) as response:
            assert response.headers["content-type"] == dialect.content_type
            texts = response.aiter_text()
            raw = await read_until(texts, '"so far"')
            request_id = node.only_request_id()
            cancelled = await http.post(f"/v1/cancel/{request_id}")
            raw += "".join([text async for text in texts])
    assert cancelled.status_code == 200
    assert cancelled.json() == {"request_id": request_id, "cancelled": True}
    events = dialect.events(raw)
    assert dialect.text(events) == "so far"
    assert dialect.ending(events) == dialect.ended_by_cancel
    assert request_id.startswith(dialect.id_prefix)
    if dialect.streamed_id is not None:  # the id a client of the stream would cancel by
        assert dialect.streamed_id(events) == request_id
    assert node.exits[request_id] == "completed"


@each_dialect
async def test_long_silences_are_kept_alive_where_the_format_allows(
    http: httpx.AsyncClient, node: FakeNode, dialect: Dialect
) -> None:
    node.script = (Step(text="a"), Step(delay=SILENCE_S, text="b", finish="length"))
    with trio.fail_after(TEST_TIMEOUT_S):
        status, raw = await dialect.read_stream(http, dialect.body(True))
    assert status == 200
    # Read strictly: besides the events only SSE comments pass; in NDJSON, only JSON lines.
    events = dialect.events(raw)
    assert (KEEPALIVE in raw) == dialect.keeps_alive
    assert dialect.text(events) == "ab"
    assert dialect.ending(events) == dialect.ended_by_length


@pytest.mark.parametrize("api_config", [QUIET_KEEPALIVE_S], indirect=True, ids=["quiet"])
@each_dialect
async def test_no_keepalive_while_chunks_keep_coming(
    http: httpx.AsyncClient, dialect: Dialect
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        status, raw = await dialect.read_stream(http, dialect.body(True))
    assert status == 200
    assert dialect.text(dialect.events(raw)) == "Hello world!"
    assert "keep-alive" not in raw
