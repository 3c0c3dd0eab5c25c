"""API keys and TLS: every endpoint but /health needs a key when keys are set; 401s in each
dialect's shape; the API over HTTPS (a real server over a fake node)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import trio
from tls_cert import make_self_signed

from trexo.api.app import create_app
from trexo.api.auth import ApiKeys, presented_key
from trexo.api.server import ApiServer
from trexo.config import ApiConfig

from .fake_node import DEMO, NODE_ID, FakeNode

TEST_TIMEOUT_S = 30.0
KEY = "sk-trexo-test-key-1"
OTHER_KEY = "sk-trexo-test-key-2"
WRONG = "sk-wrong"
CHAT = {"model": DEMO.model_id, "messages": [{"role": "user", "content": "hi"}]}
ORIGIN = "https://app.example"


async def serve(nursery: trio.Nursery, config: ApiConfig) -> str:
    url: str = await nursery.start(ApiServer(create_app(FakeNode(), config), config).run)
    return url


@pytest.fixture
async def http(nursery: trio.Nursery) -> AsyncIterator[httpx.AsyncClient]:
    config = ApiConfig(port=0, api_keys=(KEY, OTHER_KEY), cors_origins=(ORIGIN,))
    async with httpx.AsyncClient(base_url=await serve(nursery, config), timeout=20) as client:
        yield client


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# Each endpoint family, with what a request needs to be valid, and its dialect's 401 body.
ENDPOINTS = [
    ("GET", "/v1/models", None),
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"model": DEMO.model_id, "prompt": "hi"}),
    ("POST", "/v1/responses", {"model": DEMO.model_id, "input": "hi"}),
    ("POST", "/v1/messages", {"model": DEMO.model_id, "max_tokens": 5, "messages": []}),
    ("GET", "/api/tags", None),
    ("POST", "/api/chat", {"model": DEMO.model_id, "messages": []}),
    ("GET", "/state", None),
    ("GET", "/instances", None),
    ("POST", "/instances", {"model": DEMO.model_id}),
    ("DELETE", "/instances/x", None),
    ("POST", "/v1/cancel/x", None),
    ("GET", "/no/such/path", None),
]


def is_401_in_shape(path: str, response: httpx.Response) -> bool:
    body = response.json()
    if path.startswith("/v1/messages"):
        return body["type"] == "error" and body["error"]["type"] == "authentication_error"
    if path.startswith("/api/"):
        return set(body) == {"error"} and isinstance(body["error"], str)
    return body["error"]["code"] == "invalid_api_key" and body["error"]["type"] == (
        "invalid_request_error"
    )


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
async def test_every_endpoint_needs_a_key(
    http: httpx.AsyncClient, method: str, path: str, body: object
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        for headers in ({}, bearer(WRONG), {"x-api-key": WRONG}, {"Authorization": KEY}):
            response = await http.request(method, path, json=body, headers=headers)
            assert response.status_code == 401, (headers, response.text)
            assert is_401_in_shape(path, response), response.text
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
            assert WRONG not in response.text
        for headers in (bearer(KEY), bearer(OTHER_KEY), {"x-api-key": KEY}, bearer(KEY).copy()):
            response = await http.request(method, path, json=body, headers=headers)
            assert response.status_code != 401, response.text


async def test_health_and_cors_preflights_need_no_key(http: httpx.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        assert (await http.get("/health")).status_code == 200
        preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
        response = await http.options("/v1/chat/completions", headers=preflight)
        assert response.status_code == 204
        assert response.headers["Access-Control-Allow-Origin"] == ORIGIN
        # The 401 itself carries the CORS headers, so a page can read why it failed.
        response = await http.get("/v1/models", headers={"Origin": ORIGIN})
        assert response.status_code == 401
        assert response.headers["Access-Control-Allow-Origin"] == ORIGIN


async def test_the_official_clients_get_401_without_the_key_and_200_with_it(
    http: httpx.AsyncClient,
) -> None:
    url = str(http.base_url).rstrip("/")
    with trio.fail_after(TEST_TIMEOUT_S):
        for key in (WRONG, KEY):
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
            if key == WRONG:
                with pytest.raises(openai.AuthenticationError):
                    await client.models.list()
            else:
                assert [m.id async for m in client.models.list()]
            messages = anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0)
            if key == WRONG:
                with pytest.raises(anthropic.AuthenticationError):
                    await messages.messages.count_tokens(model=DEMO.model_id, messages=[])
            await client.close()
            await messages.close()


async def test_keys_appear_in_no_log_line_and_no_repr(
    http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with trio.fail_after(TEST_TIMEOUT_S):
        await http.get("/v1/models", headers=bearer(KEY))
        await http.get("/v1/models", headers=bearer(WRONG))
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert KEY not in text and WRONG not in text
    config = ApiConfig(api_keys=(KEY,))
    assert KEY not in repr(config) and KEY not in repr(ApiKeys((KEY,)))


async def test_the_dashboards_files_need_no_key_and_its_feed_does(
    http: httpx.AsyncClient,
) -> None:
    """The page's files hold no data, and a browser cannot send a header loading a page:
    they are served without a key. What the page shows, /state/events, needs it."""
    with trio.fail_after(TEST_TIMEOUT_S):
        for path in ("/", "/dashboard/app.js", "/dashboard/style.css"):
            response = await http.get(path)
            assert response.status_code == 200, (path, response.text)
            assert (await http.head(path)).status_code == 200
        assert (await http.get("/dashboard/nope.js")).status_code == 404
        assert (await http.post("/", json={})).status_code == 401  # only reading the files
        for headers in ({}, bearer(WRONG)):
            response = await http.get("/state/events", headers=headers)
            assert response.status_code == 401
            assert is_401_in_shape("/state/events", response), response.text
        async with http.stream("GET", "/state/events", headers=bearer(KEY)) as response:
            assert response.status_code == 200
            lines = response.aiter_lines()
            while not (line := await anext(lines)).startswith("data: "):
                pass
    assert json.loads(line.removeprefix("data: "))["node_id"] == NODE_ID


def test_keys_compare_against_every_key() -> None:
    keys = ApiKeys((KEY, OTHER_KEY))
    assert keys.accepts(KEY) and keys.accepts(OTHER_KEY)
    assert not keys.accepts(None) and not keys.accepts("") and not keys.accepts(KEY + "x")
    assert not keys.accepts("ключ\udcff")  # anything a header may hold is just wrong
    assert not ApiKeys().required_for("GET", "/v1/models")
    assert not keys.required_for("GET", "/health")
    assert not keys.required_for("OPTIONS", "/v1/models")
    assert keys.required_for("GET", "/state")
    assert not keys.required_for("GET", "/") and not keys.required_for("HEAD", "/dashboard/app.js")
    assert keys.required_for("POST", "/") and keys.required_for("GET", "/dashboards")


def test_the_key_is_read_from_either_header() -> None:
    assert presented_key({"Authorization": "Bearer k1"}) == "k1"
    assert presented_key({"Authorization": "bearer  k1 "}) == "k1"
    assert presented_key({"x-api-key": "k2"}) == "k2"
    assert presented_key({"Authorization": "Basic abc", "x-api-key": "k3"}) == "k3"
    assert presented_key({}) is None


async def test_without_keys_the_api_is_open(nursery: trio.Nursery) -> None:
    url = await serve(nursery, ApiConfig(port=0))
    with trio.fail_after(TEST_TIMEOUT_S):
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/state")).status_code == 200


async def test_https_with_a_self_signed_certificate(nursery: trio.Nursery, tmp_path: Path) -> None:
    tls = make_self_signed(tmp_path)
    config = ApiConfig(port=0, ollama_port=0, api_keys=(KEY,), tls_cert=tls.cert, tls_key=tls.key)
    server = ApiServer(create_app(FakeNode(), config), config)
    with trio.fail_after(TEST_TIMEOUT_S):
        url = await nursery.start(server.run)
        assert url.startswith("https://127.0.0.1:")
        assert server.ollama_url is not None and server.ollama_url.startswith("https://")
        async with httpx.AsyncClient(verify=tls.client_context()) as trusting:
            client = openai.AsyncOpenAI(
                base_url=f"{url}/v1", api_key=KEY, max_retries=0, http_client=trusting
            )
            assert DEMO.model_id in [m.id async for m in client.models.list()]
            tags = await trusting.get(f"{server.ollama_url}/api/tags", headers=bearer(KEY))
            assert tags.status_code == 200
        async with httpx.AsyncClient() as untrusting:
            with pytest.raises(httpx.ConnectError):  # not a certificate it trusts
                await untrusting.get(f"{url}/health")
        async with httpx.AsyncClient(base_url=url.replace("https", "http")) as plain:
            with pytest.raises(httpx.HTTPError):  # plain HTTP is not served
                await plain.get("/health")
