"""Connection limits below HTTP: the cap on concurrent connections (503 past it), and an
accept loop that waits out a process with no file descriptor left."""

from __future__ import annotations

import logging

import pytest
import trio
from fd_exhaustion import exhausted_fds

from tests.waiting import NotYet, holds_for, wait_until
from trexo.api.app import create_app
from trexo.api.connections import ConnectionCap
from trexo.api.server import ApiServer, connection_limit
from trexo.config import API_ACCEPT_RETRY_S, API_FD_RESERVE, ApiConfig

from .fake_node import FakeNode
from .raw_http import (
    SLOW_BODY,
    host_port,
    parse_response,
    read_response,
    read_until_eof,
    request_bytes,
)

TEST_TIMEOUT_S = 30.0
SEEN_BOUND_S = 10.0
"""Generous: the server sees a connection come or go, or fails an accept, in milliseconds."""
CAP = 4


def test_connection_limit_leaves_descriptors_to_the_node() -> None:
    assert connection_limit(1000, 1_048_576) == 1000
    assert connection_limit(1000, 1024) == 1024 - API_FD_RESERVE
    assert connection_limit(1000, 256) == 128  # at least half the limit
    assert connection_limit(10, 1024) == 10


def test_refusal_is_an_openai_style_503() -> None:
    response = parse_response(ConnectionCap(7, retry_after=2.5).refusal())
    assert response.status == 503
    assert response.headers["retry-after"] == "3"  # whole seconds, rounded up
    assert response.headers["connection"] == "close"
    error = response.json()["error"]
    assert error["type"] == "server_error"
    assert error["code"] == "too_many_connections"
    assert "7 connections" in error["message"]


async def test_connections_past_the_cap_get_503_until_some_close(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    config = ApiConfig(port=0, max_connections=CAP)
    server = ApiServer(create_app(FakeNode(), config), config)
    address = host_port(await nursery.start(server.run))
    with trio.fail_after(TEST_TIMEOUT_S):
        held = [await trio.open_tcp_stream(*address) for _ in range(CAP)]
        for stream in held[: CAP // 2]:  # half busy with a request, half idle
            await stream.send_all(SLOW_BODY)
        await wait_until(
            lambda: server.cap.statistics().active == CAP or NotYet(server.cap.statistics()),
            timeout=SEEN_BOUND_S,
            what=f"the server to hold all {CAP} connections",
        )
        for _ in range(3):
            async with await trio.open_tcp_stream(*address) as extra:
                await extra.send_all(request_bytes("GET", "/health"))
                refused = parse_response(await read_until_eof(extra))
            assert refused.status == 503
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "too_many_connections"
        assert server.cap.statistics().refused == 3
        for stream in held:
            await stream.aclose()
        # The server sees those closes in its own time; then a new client is served.
        await wait_until(
            lambda: server.cap.statistics().active == 0 or NotYet(server.cap.statistics()),
            timeout=SEEN_BOUND_S,
            what="the server to see the held connections closed",
        )
        async with await trio.open_tcp_stream(*address) as client:
            await client.send_all(request_bytes("GET", "/health"))
            assert (await read_response(client, bytearray())).status == 200
    [warning] = [r for r in caplog.records if "refused a connection with 503" in r.message]
    assert warning.levelno == logging.WARNING


async def test_accept_waits_while_out_of_descriptors(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    config = ApiConfig(port=0)
    address = host_port(await nursery.start(ApiServer(create_app(FakeNode(), config), config).run))
    with trio.fail_after(TEST_TIMEOUT_S):
        client = trio.socket.socket()  # the client's own descriptor, before they run out
        with exhausted_fds():
            await client.connect(address)  # queued in the backlog; accept fails meanwhile
            await wait_until(
                lambda: connection_log(caplog),
                timeout=SEEN_BOUND_S,
                what="the accept loop to report it is out of descriptors",
            )
            # `accept` fails again every API_ACCEPT_RETRY_S meanwhile: no line for those.
            await holds_for(
                lambda: len(connection_log(caplog)) == 1,
                seconds=3 * API_ACCEPT_RETRY_S,
                what="one log line for the whole episode",
            )
        stream = trio.SocketStream(client)
        async with stream:
            await stream.send_all(request_bytes("GET", "/health"))
            assert (await read_response(stream, bytearray())).status == 200
    messages = connection_log(caplog)
    assert messages[0].startswith("cannot accept connections: Too many open files (EMFILE)")
    assert messages[-1].startswith("accepting connections again after")
    assert len(messages) == 2  # one line per episode, not one per failed accept
    assert not [r for r in caplog.records if r.exc_info]


def connection_log(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "trexo.api.connections"]
