"""Fixtures: a real hypercorn server on 127.0.0.1, port 0, over a scripted fake node."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest
import trio

from trexo.api.app import create_app
from trexo.api.server import ApiServer
from trexo.config import ApiConfig

from .fake_node import FakeNode

MAX_BODY_BYTES = 2048
"""Small, so an oversize body fits in socket buffers and the client reads the 413."""
KEEPALIVE_S = 0.2
SILENCE_S = 5 * KEEPALIVE_S
"""A pause in a script that keep-alives fill, even when, under load, the server's silence
timer starts late."""
CLIENT_TIMEOUT_S = 20.0


@pytest.fixture
def node() -> FakeNode:
    return FakeNode()


@pytest.fixture
def api_config() -> ApiConfig:
    return ApiConfig(port=0, max_body_bytes=MAX_BODY_BYTES, keepalive_interval=KEEPALIVE_S)


@pytest.fixture
async def api_url(nursery: trio.Nursery, node: FakeNode, api_config: ApiConfig) -> str:
    url: str = await nursery.start(ApiServer(create_app(node, api_config), api_config).run)
    return url


@pytest.fixture
async def http(api_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api_url, timeout=CLIENT_TIMEOUT_S) as client:
        yield client


@pytest.fixture
async def client(api_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{api_url}/v1", api_key="x", max_retries=0, timeout=CLIENT_TIMEOUT_S
    ) as client:
        yield client
