"""`POST /v1/responses` against a real server over the scripted fake node: the official
client, raw named-SSE events and errors in OpenAI's shape. What every dialect does alike
(disconnects, cancel by id, keep-alives) is in `test_streaming_http`."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from typing import Any

import attrs
import httpx
import openai
import pytest
import trio

from trexo.errors import GenerationFailed
from trexo.types.chunks import Chunk, Usage
from trexo.types.generation import GenerationRequest, ToolCall, ToolChoice
from trexo.types.ids import RequestId

from .dialects import OPENAI_RESPONSES
from .fake_node import DEMO, FAKE_CONTEXT, FakeNode, Step

TEST_TIMEOUT_S = 30.0
PATH = OPENAI_RESPONSES.path
CALL = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


class ToolCallingNode(FakeNode):
    """The fake node, with tool calls riding on its script's chunks: `calls[i]` on the i-th."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[int, tuple[ToolCall, ...]] = {}

    def open_generation(
        self, model_id: str, request: GenerationRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[Chunk]]:
        return self._with_calls(super().open_generation(model_id, request))

    @asynccontextmanager
    async def _with_calls(
        self, generation: AbstractAsyncContextManager[AsyncIterator[Chunk]]
    ) -> AsyncIterator[AsyncIterator[Chunk]]:
        async with generation as chunks, aclosing(self._attach(chunks)) as attached:
            yield attached

    async def _attach(self, chunks: AsyncIterator[Chunk]) -> AsyncGenerator[Chunk, None]:
        index = 0
        async for chunk in chunks:
            yield attrs.evolve(chunk, tool_calls=self.calls.get(index, ()))
            index += 1


@pytest.fixture
def node() -> ToolCallingNode:
    return ToolCallingNode()


def body(**extra: Any) -> dict[str, Any]:
    return {"model": DEMO.model_id, "input": "hi", **extra}


async def test_openai_client_text(client: openai.AsyncOpenAI, node: ToolCallingNode) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await client.responses.create(
            model=DEMO.model_id,
            input="hi",
            instructions="Be brief.",
            max_output_tokens=7,
            temperature=0.5,
        )
    assert response.id == node.only_request_id()
    assert (response.object, response.status, response.model) == (
        "response",
        "completed",
        DEMO.model_id,
    )
    assert response.output_text == "Hello world!"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (5, 3)
    assert response.instructions == "Be brief."
    [(model_id, request)] = node.requests
    assert model_id == DEMO.model_id
    assert request.messages is not None
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "Be brief."),
        ("user", "hi"),
    ]
    assert (request.params.max_tokens, request.params.temperature) == (7, 0.5)
    assert node.exits[request.request_id] == "completed"


async def test_openai_client_tool_call(client: openai.AsyncOpenAI, node: ToolCallingNode) -> None:
    node.script = (Step(finish="tool_calls", usage=Usage(9, 4)),)
    node.calls = {0: (CALL,)}
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await client.responses.create(
            model=DEMO.model_id,
            input="weather?",
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "get_weather"},
        )
    [item] = response.output
    assert item.type == "function_call"
    assert (item.name, item.call_id, json.loads(item.arguments)) == (
        "get_weather",
        "call_1",
        {"city": "Paris"},
    )
    [(_, request)] = node.requests
    assert [tool.name for tool in request.tools] == ["get_weather"]
    assert request.tool_choice == ToolChoice("function", "get_weather")


async def test_openai_client_stream_helper(
    client: openai.AsyncOpenAI, node: ToolCallingNode
) -> None:
    node.script = (
        Step(text="Looking"),
        Step(text=".", finish="tool_calls", usage=Usage(5, 2)),
    )
    node.calls = {1: (CALL,)}
    with trio.fail_after(TEST_TIMEOUT_S):
        async with client.responses.stream(
            model=DEMO.model_id,
            input="weather?",
            tools=[WEATHER],
        ) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 2
    assert kinds.count("response.function_call_arguments.delta") == 1
    assert final.id == node.only_request_id()
    assert final.output_text == "Looking."
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert node.exits[RequestId(final.id)] == "completed"


async def test_openai_client_stream_events(client: openai.AsyncOpenAI) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        stream = await client.responses.create(model=DEMO.model_id, input="hi", stream=True)
        events = [event async for event in stream]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas == ["Hello", " world", "!"]
    last = events[-1]
    assert last.type == "response.completed"
    assert last.response.output_text == "Hello world!"


async def test_raw_stream_is_named_sse(http: httpx.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        status, raw = await OPENAI_RESPONSES.read_stream(http, body(stream=True))
    assert status == 200
    assert "[DONE]" not in raw
    events = OPENAI_RESPONSES.events(raw)
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["usage"]["total_tokens"] == 8


async def test_length_stream_ends_incomplete(http: httpx.AsyncClient, node: FakeNode) -> None:
    node.script = (Step(text="a"), Step(text="b", finish="length"))
    with trio.fail_after(TEST_TIMEOUT_S):
        _, raw = await OPENAI_RESPONSES.read_stream(http, body(stream=True, max_output_tokens=2))
    final = OPENAI_RESPONSES.events(raw)[-1]
    assert final["type"] == "response.incomplete"
    assert final["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_failure_mid_stream_is_an_error_event_then_failed(
    http: httpx.AsyncClient, node: FakeNode
) -> None:
    node.script = (Step(text="partial"), Step(error=GenerationFailed("runner died: SIGKILL")))
    with trio.fail_after(TEST_TIMEOUT_S):
        status, raw = await OPENAI_RESPONSES.read_stream(http, body(stream=True))
    assert status == 200
    *_, error, failed = OPENAI_RESPONSES.events(raw)
    assert error["type"] == "error"
    assert (error["code"], error["message"]) == ("generation_failed", "runner died: SIGKILL")
    assert failed["type"] == "response.failed"
    assert failed["response"]["status"] == "failed"
    assert (await http.get("/health")).status_code == 200


async def test_failure_mid_stream_reaches_the_openai_client(
    client: openai.AsyncOpenAI, node: FakeNode
) -> None:
    node.script = (Step(text="partial"), Step(error=GenerationFailed("runner died")))
    with trio.fail_after(TEST_TIMEOUT_S):
        stream = await client.responses.create(model=DEMO.model_id, input="hi", stream=True)
        events = [event async for event in stream]
    errors = [e for e in events if e.type == "error"]
    assert [e.message for e in errors] == ["runner died"]
    assert events[-1].type == "response.failed"


async def test_failure_non_streaming_is_500(http: httpx.AsyncClient, node: FakeNode) -> None:
    node.script = (Step(text="partial"), Step(error=GenerationFailed("runner died")))
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post(PATH, json=body())
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "generation_failed"


@pytest.mark.parametrize(
    ("payload", "status", "param", "code"),
    [
        (body(bogus=1), 400, "bogus", "unknown_parameter"),
        (body(input=[]), 400, "input", "empty_array"),
        (body(tools=[{"type": "web_search"}]), 400, "tools[0].type", "unsupported_value"),
        (body(previous_response_id="resp_x"), 400, "previous_response_id", None),
        (body(reasoning={"effort": "extreme"}), 400, "reasoning.effort", "invalid_value"),
        (body(model="no-such-model"), 404, None, "model_not_found"),
        (body(input=" ".join(["word"] * FAKE_CONTEXT)), 400, None, None),  # over the context
    ],
)
async def test_bad_requests_are_openai_errors_and_the_node_still_serves(
    http: httpx.AsyncClient,
    node: FakeNode,
    payload: dict[str, Any],
    status: int,
    param: str | None,
    code: str | None,
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        for stream in (False, True):
            response = await http.post(PATH, json={**payload, "stream": stream})
            assert response.status_code == status, response.text
            assert response.headers["content-type"].startswith("application/json")
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["type"] == "invalid_request_error"
            if param is not None:
                assert error["param"] == param
            if code is not None:
                assert error["code"] == code
        assert node.requests == []
        good = await http.post(PATH, json=body())
    assert good.status_code == 200
    assert good.json()["status"] == "completed"


async def test_openai_client_raises_bad_request(client: openai.AsyncOpenAI) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(
                model=DEMO.model_id,
                input="hi",
                previous_response_id="resp_earlier",
            )
        assert "does not store responses" in caught.value.message
        with pytest.raises(openai.NotFoundError) as missing:
            await client.responses.retrieve("resp_earlier")
        assert missing.value.code == "response_not_found"
        response = await client.responses.create(model=DEMO.model_id, input="hi")
    assert response.output_text == "Hello world!"
