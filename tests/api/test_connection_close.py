"""Connections that must close do close: HTTP/1.0 and `Connection: close` requests end with
EOF from the server once the response is out, JSON and SSE alike; keep-alive still works.

Spoken by hand over raw sockets, so the client never closes first: each test fails if the
server leaves the connection open (it did, until `trexo.api.exchange` worked around a
hypercorn/quart-trio bug: docs/upstream/hypercorn-connection-close.md).
"""

from __future__ import annotations

import json

import pytest
import trio

from .fake_node import DEMO
from .raw_http import host_port, parse_response, read_response, read_until_eof, request_bytes

TEST_TIMEOUT_S = 30.0
CHAT = json.dumps(
    {"model": DEMO.model_id, "messages": [{"role": "user", "content": "hi"}], "stream": True}
).encode()
CLOSING = [
    pytest.param("1.0", {}, id="http-1.0"),
    pytest.param("1.1", {"Connection": "close"}, id="http-1.1-connection-close"),
]


async def exchange(api_url: str, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream(*host_port(api_url))
    async with stream:
        await stream.send_all(request)
        return await read_until_eof(stream)


@pytest.mark.parametrize(("version", "headers"), CLOSING)
async def test_json_response_then_eof(api_url: str, version: str, headers: dict[str, str]) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        data = await exchange(
            api_url, request_bytes("GET", "/health", version=version, headers=headers)
        )
    response = parse_response(data)
    assert response.status == 200
    assert response.json() == {"node_id": "fake-node", "session": "s-1"}


@pytest.mark.parametrize(("version", "headers"), CLOSING)
async def test_sse_stream_then_eof(api_url: str, version: str, headers: dict[str, str]) -> None:
    request = request_bytes(
        "POST",
        "/v1/chat/completions",
        version=version,
        headers={"Content-Type": "application/json", **headers},
        body=CHAT,
    )
    with trio.fail_after(TEST_TIMEOUT_S):
        data = await exchange(api_url, request)
    response = parse_response(data)
    assert response.status == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [e for e in response.body.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    text = "".join(
        json.loads(e.removeprefix(b"data: "))["choices"][0]["delta"].get("content", "")
        for e in events[:-1]
        if e.startswith(b"data: {")
    )
    assert text == "Hello world!"


async def test_error_response_then_eof(api_url: str) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        data = await exchange(api_url, request_bytes("GET", "/nowhere", version="1.0"))
    response = parse_response(data)
    assert response.status == 404
    assert response.json()["error"]["code"] == "unknown_url"


async def test_keep_alive_serves_two_requests_then_closes_on_request(api_url: str) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        stream = await trio.open_tcp_stream(*host_port(api_url))
        async with stream:
            buffer = bytearray()
            await stream.send_all(request_bytes("GET", "/health"))
            first = await read_response(stream, buffer)
            await stream.send_all(request_bytes("GET", "/v1/models"))
            second = await read_response(stream, buffer)
            assert (first.status, second.status) == (200, 200)
            assert first.json()["node_id"] == "fake-node"
            assert second.json()["object"] == "list"
            # The same connection, asked to close on the third request, does close.
            await stream.send_all(request_bytes("GET", "/health", headers={"Connection": "close"}))
            third = parse_response(bytes(buffer) + await read_until_eof(stream))
            assert third.status == 200
