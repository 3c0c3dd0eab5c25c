"""`POST /v1/messages` and `/v1/messages/count_tokens` against a real server over the fake
node: anthropic's client, raw named SSE events, Anthropic-shaped errors. What every dialect
does alike (disconnects, cancel by id, keep-alives) is in `test_streaming_http`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import pytest
import trio

from trexo.errors import GenerationFailed

from .conftest import CLIENT_TIMEOUT_S, MAX_BODY_BYTES, SILENCE_S
from .dialects import ANTHROPIC
from .fake_node import DEMO, FAKE_CONTEXT, OTHER, TOO_BIG, FakeNode, Step
from .sse import named_events

TEST_TIMEOUT_S = 30.0
MESSAGES: list[Any] = [{"role": "user", "content": "hi there"}]


def message(**extra: Any) -> dict[str, Any]:
    return {"model": DEMO.model_id, "max_tokens": 16, "messages": MESSAGES, **extra}


@pytest.fixture
async def claude(api_url: str) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(
        base_url=api_url, api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT_S
    ) as client:
        yield client


def assert_anthropic_error(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == kind
    assert body["error"]["message"]
    return body


async def test_client_create(claude: anthropic.AsyncAnthropic, node: FakeNode) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        reply = await claude.messages.create(
            model=DEMO.model_id,
            max_tokens=7,
            messages=MESSAGES,
            system="Be brief.",
            extra_body={"temperature": 0.5},  # this client version has no field for it
            stop_sequences=["STOP"],
        )
    assert reply.id.startswith("msg_")
    assert (reply.type, reply.role, reply.model) == ("message", "assistant", DEMO.model_id)
    [block] = reply.content
    assert block.type == "text" and block.text == "Hello world!"
    assert (reply.stop_reason, reply.stop_sequence) == ("end_turn", None)
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (5, 3)
    [(model_id, request)] = node.requests
    assert model_id == DEMO.model_id
    assert request.request_id == reply.id
    assert request.messages is not None
    assert [m.role for m in request.messages] == ["system", "user"]
    assert (request.params.max_tokens, request.params.temperature) == (7, 0.5)
    assert request.params.stop == ("STOP",)
    assert node.exits[request.request_id] == "completed"


async def test_client_stream(claude: anthropic.AsyncAnthropic, node: FakeNode) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with claude.messages.stream(
            model=DEMO.model_id, max_tokens=16, messages=MESSAGES
        ) as stream:
            texts = [text async for text in stream.text_stream]
            final = await stream.get_final_message()
        whole = await claude.messages.create(model=DEMO.model_id, max_tokens=16, messages=MESSAGES)
    assert texts == ["Hello", " world", "!"]
    assert final.id == node.requests[0][1].request_id
    assert final.model_dump(exclude={"id"}) == whole.model_dump(exclude={"id"})


async def test_raw_stream_is_anthropics_named_events(
    http: httpx.AsyncClient, node: FakeNode
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        status, raw = await ANTHROPIC.read_stream(http, message(stream=True))
    assert status == 200
    events = named_events(raw)
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0]["message"]
    assert start["id"] == node.only_request_id()
    # Counted on this node before the first token: the fake counts one token per word.
    assert start["usage"] == {"input_tokens": 2, "output_tokens": 0}
    assert events[-2]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert events[-2]["usage"]["output_tokens"] == 3


async def test_keepalives_during_silences_do_not_disturb_the_client(
    claude: anthropic.AsyncAnthropic, node: FakeNode
) -> None:
    # A silence that keep-alive comments fill (`test_streaming_http` proves it, per dialect).
    node.script = (Step(text="a"), Step(delay=SILENCE_S, text="b", finish="length"))
    with trio.fail_after(TEST_TIMEOUT_S):
        async with claude.messages.stream(
            model=DEMO.model_id, max_tokens=16, messages=MESSAGES
        ) as stream:
            texts = [text async for text in stream.text_stream]
            final = await stream.get_final_message()
    assert texts == ["a", "b"]
    assert final.content[0].type == "text" and final.content[0].text == "ab"
    assert final.stop_reason == "max_tokens"


async def test_failure_mid_stream_is_an_error_event(
    http: httpx.AsyncClient, claude: anthropic.AsyncAnthropic, node: FakeNode
) -> None:
    node.script = (Step(text="partial"), Step(error=GenerationFailed("runner died: SIGKILL")))
    with trio.fail_after(TEST_TIMEOUT_S):
        status, raw = await ANTHROPIC.read_stream(http, message(stream=True))
        with pytest.raises(anthropic.APIStatusError, match="runner died") as caught:
            async with claude.messages.stream(
                model=DEMO.model_id, max_tokens=16, messages=MESSAGES
            ) as stream:
                await stream.get_final_message()
        assert (await http.get("/health")).status_code == 200
    assert status == 200
    events = named_events(raw)
    assert events[-1] == {
        "type": "error",
        "error": {"type": "api_error", "message": "runner died: SIGKILL"},
    }
    assert "message_stop" not in [e["type"] for e in events]
    assert caught.value.type == "api_error"


async def test_failure_without_stream_is_a_500_api_error(
    http: httpx.AsyncClient, node: FakeNode
) -> None:
    node.script = (Step(text="partial"), Step(error=GenerationFailed("runner died")))
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post("/v1/messages", json=message())
    body = assert_anthropic_error(response, 500, "api_error")
    assert body["error"]["message"] == "runner died"


async def test_bad_request_is_an_anthropic_400_and_the_node_keeps_serving(
    claude: anthropic.AsyncAnthropic, node: FakeNode
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        with pytest.raises(anthropic.BadRequestError) as caught:
            await claude.messages.create(
                model=DEMO.model_id,
                max_tokens=16,
                messages=MESSAGES,
                thinking={"type": "enabled", "budget_tokens": 2048},
            )
        reply = await claude.messages.create(model=DEMO.model_id, max_tokens=16, messages=MESSAGES)
    assert caught.value.status_code == 400
    assert caught.value.type == "invalid_request_error"
    assert "thinking" in (caught.value.api_message or "")
    assert reply.stop_reason == "end_turn"
    assert len(node.requests) == 1  # the bad one never reached the node


BAD_REQUESTS: list[tuple[str, str, bytes, int, str]] = [
    # (method, path, body, status, Anthropic error type)
    ("POST", "/v1/messages", b"{not json", 400, "invalid_request_error"),
    ("POST", "/v1/messages", b"[]", 400, "invalid_request_error"),
    (
        "POST",
        "/v1/messages",
        json.dumps(message(max_tokens=None)).encode(),
        400,
        "invalid_request_error",
    ),
    ("POST", "/v1/messages", json.dumps(message(model="nope")).encode(), 404, "not_found_error"),
    (
        "POST",
        "/v1/messages",
        # A prompt that fills the fake's context: no room for an answer. (A max_tokens past
        # the room is capped, not refused.)
        json.dumps(
            message(messages=[{"role": "user", "content": " ".join(["word"] * FAKE_CONTEXT)}])
        ).encode(),
        400,
        "invalid_request_error",
    ),
    (
        "POST",
        "/v1/messages",
        json.dumps(message(messages=[{"role": "user", "content": "x" * MAX_BODY_BYTES}])).encode(),
        413,
        "request_too_large",
    ),
    ("GET", "/v1/messages", b"", 405, "invalid_request_error"),
    ("POST", "/v1/messages/batches", b"{}", 404, "not_found_error"),
    (
        "POST",
        "/v1/messages/count_tokens",
        json.dumps(message()).encode(),
        400,
        "invalid_request_error",
    ),
]


@pytest.mark.parametrize(("method", "path", "raw", "status", "kind"), BAD_REQUESTS)
async def test_errors_under_v1_messages_are_anthropics_shape(
    http: httpx.AsyncClient, method: str, path: str, raw: bytes, status: int, kind: str
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.request(
            method, path, content=raw, headers={"content-type": "application/json"}
        )
        assert_anthropic_error(response, status, kind)
        if status == 413:
            return  # that connection closes; the next test's client opens another
        ok = await http.post("/v1/messages", json=message())
    assert ok.status_code == 200
    assert ok.json()["content"][0]["text"] == "Hello world!"


async def test_other_paths_keep_openais_error_shape(http: httpx.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post("/v1/chat/completions", json={"model": DEMO.model_id})
    assert response.status_code == 400
    assert "type" not in response.json()
    assert response.json()["error"]["code"] == "missing_required_parameter"


@pytest.mark.parametrize("stream", [False, True])
async def test_no_session_is_a_retryable_overloaded_503(
    http: httpx.AsyncClient, node: FakeNode, stream: bool
) -> None:
    node.no_session = True
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post("/v1/messages", json=message(stream=stream))
    assert_anthropic_error(response, 503, "overloaded_error")
    assert response.headers["retry-after"] == "1"


async def test_unknown_model_is_not_found_in_the_client(claude: anthropic.AsyncAnthropic) -> None:
    with trio.fail_after(TEST_TIMEOUT_S), pytest.raises(anthropic.NotFoundError) as caught:
        await claude.messages.create(model="nope", max_tokens=16, messages=MESSAGES)
    assert caught.value.type == "not_found_error"


async def test_count_tokens(claude: anthropic.AsyncAnthropic, node: FakeNode) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        counted = await claude.messages.count_tokens(
            model=DEMO.model_id,
            system="one two three",
            messages=[{"role": "user", "content": "four five"}],
        )
    assert counted.input_tokens == 5  # the fake counts words
    assert node.requests == []  # counting generates nothing


async def test_count_tokens_where_the_tokenizer_is_elsewhere_says_so(
    http: httpx.AsyncClient,
) -> None:
    body = {"model": OTHER.model_id, "messages": MESSAGES}
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post("/v1/messages/count_tokens", json=body)
    error = assert_anthropic_error(response, 503, "api_error")["error"]
    assert "tokenizer is not on this node" in error["message"]
    assert "retry-after" not in response.headers


# --- /v1/models, as Anthropic's clients see it ---------------------------------------------


async def test_the_anthropic_client_lists_and_retrieves_models_in_its_shape(
    claude: anthropic.AsyncAnthropic, http: httpx.AsyncClient
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        listed = [model async for model in claude.models.list()]
        one = await claude.models.retrieve(DEMO.model_id)
        first_page = await claude.models.list(limit=1)
        second_page = await claude.models.list(limit=1, after_id=first_page.data[0].id)
        missing = await http.get("/v1/models/nope", headers={"anthropic-version": "2023-06-01"})
        openai_shape = await http.get("/v1/models")
    assert [model.id for model in listed] == [DEMO.model_id, OTHER.model_id, TOO_BIG.model_id]
    assert all(model.type == "model" and model.created_at for model in listed)
    assert (one.id, one.display_name) == (DEMO.model_id, DEMO.model_id)
    assert [m.id for m in first_page.data] == [DEMO.model_id] and first_page.has_more
    assert [m.id for m in second_page.data] == [OTHER.model_id]
    assert_anthropic_error(missing, 404, "not_found_error")
    # Without the header, the same path is OpenAI's.
    assert openai_shape.json()["object"] == "list"
