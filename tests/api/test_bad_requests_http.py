"""Bad requests get OpenAI-style JSON errors with the right status, never an HTML page, and
the server goes on serving."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from trexo.api.app import create_app
from trexo.api.server import ApiServer
from trexo.config import ApiConfig

from .conftest import MAX_BODY_BYTES
from .fake_node import DEMO, FakeNode
from .raw_http import SLOW_BODY, host_port, parse_response, read_until_eof

TEST_TIMEOUT_S = 30.0
HUGE_BODY_ATTEMPTS = 5
"""The wedge this guards against hit about half of the attempts."""
REUSE_BOUND_S = 5.0
GOOD: dict[str, Any] = {"model": DEMO.model_id, "messages": [{"role": "user", "content": "hi"}]}


def with_(**fields: Any) -> bytes:
    return json.dumps({**GOOD, **fields}).encode()


def without(name: str) -> bytes:
    return json.dumps({k: v for k, v in GOOD.items() if k != name}).encode()


BAD_CHAT_BODIES = [
    # (body, status, param, code)
    pytest.param(
        b'{"model": "demo-tiny", "messages": [', 400, None, "invalid_json", id="malformed"
    ),
    pytest.param(b"", 400, None, "invalid_json", id="empty-body"),
    pytest.param(b"\xff\xfe{}", 400, None, "invalid_json", id="not-utf8"),
    pytest.param(with_(temperature=float("nan")), 400, None, "invalid_json", id="nan"),
    pytest.param(b"[1, 2]", 400, None, "invalid_type", id="array-body"),
    pytest.param(without("messages"), 400, "messages", "missing_required_parameter", id="no-msgs"),
    pytest.param(without("model"), 400, "model", "missing_required_parameter", id="no-model"),
    pytest.param(with_(messages=[]), 400, "messages", "empty_array", id="empty-messages"),
    pytest.param(with_(messages="hi"), 400, "messages", "invalid_type", id="messages-str"),
    pytest.param(
        with_(messages=[{"role": "wizard", "content": "x"}]),
        400,
        "messages[0].role",
        "invalid_value",
        id="bad-role",
    ),
    pytest.param(with_(temperature="hot"), 400, "temperature", "invalid_type", id="temp-str"),
    pytest.param(with_(temperature=2.5), 400, "temperature", "invalid_value", id="temp-high"),
    pytest.param(with_(max_tokens=-1), 400, "max_tokens", "invalid_value", id="max-tokens-neg"),
    pytest.param(with_(max_tokens=1.5), 400, "max_tokens", "invalid_type", id="max-tokens-float"),
    pytest.param(with_(stream="yes"), 400, "stream", "invalid_type", id="stream-str"),
    pytest.param(with_(n=2), 400, "n", "unsupported_value", id="n-2"),
    pytest.param(with_(frequency_penalty=0.5), 400, "frequency_penalty", "unsupported_parameter"),
    pytest.param(
        with_(tools=[{"type": "function", "function": {"name": "no spaces"}}]),
        400,
        "tools[0].function.name",
        "invalid_value",
        id="tool-name",
    ),
    pytest.param(
        with_(tools=[{"type": "retrieval"}]),
        400,
        "tools[0].type",
        "unsupported_value",
        id="tool-type",
    ),
    pytest.param(
        with_(tool_choice="required"), 400, "tool_choice", "invalid_value", id="choice-no-tools"
    ),
    pytest.param(
        with_(response_format={"type": "yaml"}),
        400,
        "response_format.type",
        "invalid_value",
        id="response-format",
    ),
    pytest.param(with_(top_logprobs=3), 400, "top_logprobs", "invalid_value", id="top-logprobs"),
    pytest.param(with_(temprature=0.1), 400, "temprature", "unknown_parameter", id="typo"),
    pytest.param(with_(model="nope"), 404, None, "model_not_found", id="unknown-model"),
    pytest.param(
        with_(stream=True, model="nope"), 404, None, "model_not_found", id="unknown-model-stream"
    ),
]


@pytest.mark.parametrize(("body", "status", "param", "code"), BAD_CHAT_BODIES)
async def test_bad_chat_request(
    http: httpx.AsyncClient, body: bytes, status: int, param: str | None, code: str
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
        assert_error(response, status, code)
        assert response.json()["error"]["param"] == param
        await assert_still_serving(http)


async def test_oversize_body_is_413(http: httpx.AsyncClient) -> None:
    padding = "x" * (MAX_BODY_BYTES + 1)
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post("/v1/chat/completions", content=with_(user=padding))
        assert_error(response, 413, "request_too_large")
        assert str(MAX_BODY_BYTES) in response.json()["error"]["message"]
        await assert_still_serving(http)


async def test_oversize_chunked_body_is_413(http: httpx.AsyncClient) -> None:
    async def body() -> Any:  # no content-length: the limit is enforced while reading
        yield with_(user="x" * (MAX_BODY_BYTES + 1))

    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post("/v1/chat/completions", content=body())
        assert_error(response, 413, "request_too_large")
        await assert_still_serving(http)


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/nowhere", 404, "unknown_url"),
        ("POST", "/v1/unknown", 404, "unknown_url"),
        ("GET", "/v1/chat/completions", 405, "method_not_allowed"),
        ("DELETE", "/v1/models", 405, "method_not_allowed"),
    ],
)
async def test_quarts_own_errors_are_json(
    http: httpx.AsyncClient, method: str, path: str, status: int, code: str
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.request(method, path)
        assert_error(response, status, code)
        assert path in response.json()["error"]["message"]
        if status == 405:
            assert "POST" in response.headers["allow"] or "GET" in response.headers["allow"]
        await assert_still_serving(http)


def assert_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    expected_type = "server_error" if status >= 500 else "invalid_request_error"
    assert body["error"]["type"] == expected_type


async def assert_still_serving(http: httpx.AsyncClient) -> None:
    response = await http.post("/v1/chat/completions", content=json.dumps(GOOD))
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "Hello world!"


async def test_a_body_slower_than_the_body_timeout_is_408(node: FakeNode) -> None:
    config = ApiConfig(port=0, body_timeout=0.2)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(ApiServer(create_app(node, config), config).run)
            # The body stops short of its Content-Length and never goes on: the server must
            # answer, and close the connection, by itself.
            async with await trio.open_tcp_stream(*host_port(url)) as stream:
                await stream.send_all(SLOW_BODY)
                raw = parse_response(await read_until_eof(stream))
            nursery.cancel_scope.cancel()
    response = httpx.Response(raw.status, headers=raw.headers, content=raw.body)
    assert_error(response, 408, "request_timeout")
    assert response.headers["connection"] == "close"


async def test_a_huge_body_gets_413_and_the_connection_is_not_reused(
    http: httpx.AsyncClient,
) -> None:
    # The client is still sending when the 413 goes out; a kept-alive connection would be
    # reused for the next request and hang (hypercorn does not read the rest of the body).
    huge = b"x" * (16 * 1024 * 1024)
    with trio.fail_after(TEST_TIMEOUT_S):
        for _ in range(HUGE_BODY_ATTEMPTS):
            response = await http.post("/v1/chat/completions", content=huge)
            assert_error(response, 413, "request_too_large")
            assert response.headers["connection"] == "close"
            with trio.fail_after(REUSE_BOUND_S):
                await assert_still_serving(http)


@pytest.mark.parametrize(
    ("path", "status"), [("/nowhere", 404), ("/health", 405), ("/v1/cancel/x", 404)]
)
async def test_an_unread_body_does_not_wedge_the_connection(
    node: FakeNode, path: str, status: int
) -> None:
    config = ApiConfig(port=0, max_body_bytes=64 * 1024 * 1024)
    big = b"x" * (16 * 1024 * 1024)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(ApiServer(create_app(node, config), config).run)
            async with httpx.AsyncClient(base_url=url) as http:
                for _ in range(HUGE_BODY_ATTEMPTS):
                    assert (await http.post(path, content=big)).status_code == status
                    with trio.fail_after(REUSE_BOUND_S):
                        await assert_still_serving(http)
            nursery.cancel_scope.cancel()
