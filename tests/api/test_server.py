"""The API service: binds, reports its address, serves, and stops when cancelled."""

from __future__ import annotations

import contextlib
import logging

import httpx
import pytest
import trio

from trexo.api.app import create_app
from trexo.api.server import ACCESS_LOGGER, ApiServer, hypercorn_config
from trexo.config import ApiConfig

from .fake_node import DEMO, FakeNode, Step

TEST_TIMEOUT_S = 30.0


async def test_port_zero_reports_the_bound_address(api_url: str, http: httpx.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        assert api_url.startswith("http://127.0.0.1:")
        assert int(api_url.rsplit(":", 1)[1]) > 0
        response = await http.get("/health")
        assert response.status_code == 200
        assert response.json() == {"node_id": "fake-node", "session": "s-1"}


async def test_cancellation_stops_the_server_and_run_returns() -> None:
    config = ApiConfig(port=0)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(ApiServer(create_app(FakeNode(), config), config).run)
            async with httpx.AsyncClient(base_url=url) as http:
                assert (await http.get("/health")).status_code == 200
            nursery.cancel_scope.cancel()
        # `run` has returned (the nursery exited); the port no longer accepts connections.
        async with httpx.AsyncClient(base_url=url) as http:
            with pytest.raises(httpx.ConnectError):
                await http.get("/health")


def test_hypercorn_binds_ipv6_literals_in_brackets() -> None:
    assert hypercorn_config(ApiConfig(host="::1", port=0)).bind == ["[::1]:0"]
    assert hypercorn_config(ApiConfig(host="0.0.0.0", port=80)).bind == ["0.0.0.0:80"]


async def test_stopping_the_server_cancels_streams_in_flight() -> None:
    node = FakeNode((Step(text="a"), Step(delay=60.0, text="b", finish="stop")))
    config = ApiConfig(port=0)
    body = {"model": DEMO.model_id, "messages": [{"role": "user", "content": "x"}], "stream": True}
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(ApiServer(create_app(node, config), config).run)

            async def streaming_client() -> None:
                async with (
                    httpx.AsyncClient(base_url=url) as http,
                    http.stream("POST", "/v1/chat/completions", json=body) as response,
                ):
                    with contextlib.suppress(httpx.HTTPError):
                        await response.aread()

            nursery.start_soon(streaming_client)
            await node.any_entered.wait()
            nursery.cancel_scope.cancel()
        assert node.exits[node.only_request_id()] == "Cancelled"


async def test_access_log_is_at_debug(
    api_url: str, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
        await http.get("/health")
        assert not [r for r in caplog.records if r.name == ACCESS_LOGGER]
        caplog.set_level(logging.DEBUG, logger=ACCESS_LOGGER)
        await http.get("/health")
        [record] = [r for r in caplog.records if r.name == ACCESS_LOGGER]
        assert record.levelno == logging.DEBUG
        assert "/health" in record.getMessage()
