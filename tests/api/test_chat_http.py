"""`POST /v1/chat/completions` against a real server: openai's client, raw SSE, failures and
concurrent streams. What every dialect does alike (disconnects, cancel by id, keep-alives) is
in `test_streaming_http`."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import openai
import pytest
import trio

from trexo.errors import GenerationFailed

from .dialects import OPENAI_CHAT
from .fake_node import DEMO, FakeNode, Step
from .sse import data_events

TEST_TIMEOUT_S = 30.0

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": DEMO.model_id, "messages": MESSAGES, **extra}


async def test_openai_client_non_streaming(client: openai.AsyncOpenAI, node: FakeNode) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        completion = await client.chat.completions.create(
            model=DEMO.model_id, messages=MESSAGES, max_tokens=7, temperature=0.5, seed=3
        )
    assert completion.id.startswith("chatcmpl-")
    assert completion.object == "chat.completion"
    assert completion.model == DEMO.model_id
    [choice] = completion.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == "Hello world!"
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (5, 3)
    assert completion.usage.total_tokens == 8
    [(model_id, request)] = node.requests
    assert model_id == DEMO.model_id
    assert request.request_id == completion.id
    assert (request.params.max_tokens, request.params.temperature) == (7, 0.5)
    assert request.params.seed == 3
    assert node.exits[request.request_id] == "completed"


async def test_openai_client_streaming_with_usage(
    client: openai.AsyncOpenAI, node: FakeNode
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        stream = await client.chat.completions.create(
            model=DEMO.model_id,
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    assert {chunk.id for chunk in chunks} == {node.only_request_id()}
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello world!"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    *content, usage_chunk = chunks
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.total_tokens == 8
    assert all(c.usage is None for c in content)
    assert node.exits[node.only_request_id()] == "completed"


async def test_raw_sse_is_exactly_openais_shape(http: httpx.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        status, raw = await OPENAI_CHAT.read_stream(http, chat(stream=True))
    assert status == 200
    events = data_events(raw)
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"content": "Hello"},
        {"content": " world"},
        {"content": "!"},
        {},
    ]
    assert [e["choices"][0]["finish_reason"] for e in events[:-1]] == [None] * 4 + ["stop"]
    assert all("usage" not in e for e in events[:-1])  # only with include_usage


async def test_failure_mid_stream_is_a_final_error_event(
    http: httpx.AsyncClient, node: FakeNode
) -> None:
    node.script = (Step(text="partial"), Step(error=GenerationFailed("runner died: SIGKILL")))
    with trio.fail_after(TEST_TIMEOUT_S):
        status, raw = await OPENAI_CHAT.read_stream(http, chat(stream=True))
    assert status == 200
    *_, error, done = data_events(raw)
    assert done == "[DONE]"
    assert error == {
        "error": {
            "message": "runner died: SIGKILL",
            "type": "server_error",
            "param": None,
            "code": "generation_failed",
        }
    }
    assert (await http.get("/health")).status_code == 200


async def test_failure_mid_stream_raises_in_openai_client(
    client: openai.AsyncOpenAI, node: FakeNode
) -> None:
    node.script = (Step(text="partial"), Step(error=GenerationFailed("runner died")))
    with trio.fail_after(TEST_TIMEOUT_S):
        stream = await client.chat.completions.create(
            model=DEMO.model_id, messages=MESSAGES, stream=True
        )
        with pytest.raises(openai.APIError, match="runner died"):
            async for _ in stream:
                pass


async def test_stream_ending_without_finish_is_an_error_event(
    http: httpx.AsyncClient, node: FakeNode
) -> None:
    node.script = (Step(text="cut"),)
    with trio.fail_after(TEST_TIMEOUT_S):
        _, raw = await OPENAI_CHAT.read_stream(http, chat(stream=True))
    assert data_events(raw)[-2]["error"]["code"] == "generation_failed"


async def test_failure_non_streaming_is_500(http: httpx.AsyncClient, node: FakeNode) -> None:
    node.script = (Step(text="partial"), Step(error=GenerationFailed("runner died")))
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post("/v1/chat/completions", json=chat())
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "generation_failed"
    assert response.json()["error"]["message"] == "runner died"


@pytest.mark.parametrize("stream", [False, True])
async def test_no_session_is_503_with_retry_after(
    http: httpx.AsyncClient, node: FakeNode, stream: bool
) -> None:
    node.no_session = True
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post("/v1/chat/completions", json=chat(stream=stream))
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"]["code"] == "no_session"
    assert response.json()["error"]["type"] == "server_error"


@pytest.mark.parametrize("stream", [False, True])
async def test_unknown_model_is_404_in_openai_client(
    client: openai.AsyncOpenAI, stream: bool
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S), pytest.raises(openai.NotFoundError) as caught:
        await client.chat.completions.create(model="nope", messages=MESSAGES, stream=stream)
    assert caught.value.code == "model_not_found"


async def test_cancel_unknown_request_is_404(http: httpx.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post("/v1/cancel/chatcmpl-nothing")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "request_not_found"


async def test_concurrent_streams_are_independent(
    client: openai.AsyncOpenAI, node: FakeNode
) -> None:
    node.script = (Step(delay=0.05, text="x"), Step(delay=0.05, text="y", finish="stop"))
    texts: list[str] = []

    async def one() -> None:
        stream = await client.chat.completions.create(
            model=DEMO.model_id, messages=MESSAGES, stream=True
        )
        texts.append("".join([c.choices[0].delta.content or "" async for c in stream]))

    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(one)
    assert texts == ["xy"] * 5
    assert len({request.request_id for _, request in node.requests}) == 5


@pytest.mark.parametrize("stream", [False, True])
async def test_an_unexpected_error_is_500_and_logged(
    http: httpx.AsyncClient, node: FakeNode, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    node.script = (Step(text="x"), Step(error=RuntimeError("a bug")))
    with trio.fail_after(TEST_TIMEOUT_S):
        if stream:
            status, raw = await OPENAI_CHAT.read_stream(http, chat(stream=True))
            assert status == 200
            error = data_events(raw)[-2]["error"]
        else:
            response = await http.post("/v1/chat/completions", json=chat())
            assert response.status_code == 500
            error = response.json()["error"]
        assert (error["code"], error["type"]) == ("internal_error", "server_error")
        assert "a bug" not in error["message"]  # details go to the log, not to the client
        logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert logged
        assert logged[0].exc_info is not None
        assert (await http.get("/health")).status_code == 200
