"""CORS: no cross-origin access unless origins are configured; OPTIONS answers 204.
(Refusing other origins' requests outright: `test_cross_site_http.py`.)"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from trexo.api.app import create_app
from trexo.api.cors import CorsPolicy, normalize_origin
from trexo.api.server import ApiServer
from trexo.cli import build_parser
from trexo.config import ApiConfig

from .fake_node import DEMO, FakeNode

TEST_TIMEOUT_S = 30.0
APP = "https://app.example"
OTHER = "https://evil.example"
PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
}
CHAT = {"model": DEMO.model_id, "messages": [{"role": "user", "content": "hi"}]}


async def serve(nursery: trio.Nursery, origins: tuple[str, ...]) -> str:
    config = ApiConfig(port=0, cors_origins=origins)
    url: str = await nursery.start(ApiServer(create_app(FakeNode(), config), config).run)
    return url


@pytest.fixture
async def open_api(nursery: trio.Nursery) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=await serve(nursery, ())) as http:
        yield http


@pytest.fixture
async def app_only(nursery: trio.Nursery) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=await serve(nursery, (APP + "/",))) as http:
        yield http


# --- the pure policy ------------------------------------------------------------------------


def test_origins_are_normalized_as_browsers_send_them() -> None:
    assert normalize_origin("HTTPS://App.Example:8443/") == "https://app.example:8443"
    assert normalize_origin(" * ") == "*"
    for bad in ("app.example", "https://app.example/path", "ftp://x", "https://u@x", ""):
        with pytest.raises(ValueError):
            normalize_origin(bad)


def test_policy_allows_only_its_origins() -> None:
    policy = CorsPolicy((APP,))
    assert policy.allowed_origin(APP) == APP
    assert policy.allowed_origin(OTHER) is None
    assert policy.allowed_origin("null") is None
    assert policy.allowed_origin(None) is None
    assert CorsPolicy(("*",)).allowed_origin(OTHER) == "*"
    assert CorsPolicy().allowed_origin(APP) is None


def test_options_headers_name_methods_and_requested_headers() -> None:
    headers = CorsPolicy((APP,), max_age=60).options_headers(
        ["POST", "OPTIONS"], {"Origin": APP, **PREFLIGHT}
    )
    assert headers == {
        "Allow": "OPTIONS, POST",
        "Access-Control-Allow-Methods": "OPTIONS, POST",
        "Access-Control-Allow-Headers": PREFLIGHT["Access-Control-Request-Headers"],
        "Access-Control-Max-Age": "60",
    }
    assert CorsPolicy().options_headers(["GET"], {"Origin": APP, **PREFLIGHT}) == {"Allow": "GET"}


def test_cli_collects_cors_origins() -> None:
    args = build_parser().parse_args(
        ["run", "--cors-origin", "https://App.example/", "--cors-origin", "*"]
    )
    assert args.cors_origin == [APP, "*"]
    assert build_parser().parse_args(["run"]).cors_origin == []
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--cors-origin", "app.example"])


# --- over HTTP ------------------------------------------------------------------------------


async def test_without_origins_no_response_allows_cross_origin(
    open_api: httpx.AsyncClient,
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        preflight = await open_api.options(
            "/v1/chat/completions", headers={"Origin": APP, **PREFLIGHT}
        )
        assert preflight.status_code == 204
        assert preflight.headers["Allow"] == "OPTIONS, POST"
        assert "access-control-allow-origin" not in preflight.headers
        assert "content-type" not in preflight.headers
        assert preflight.content == b""
        response = await open_api.post("/v1/chat/completions", json=CHAT, headers={"Origin": APP})
        assert response.status_code == 403  # and refused (`trexo.api.cross_site`)
        assert "access-control-allow-origin" not in response.headers


async def test_plain_options_answers_allow_not_html(open_api: httpx.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await open_api.options("/instances")
        assert response.status_code == 204
        assert set(response.headers["Allow"].split(", ")) == {"GET", "HEAD", "POST", "OPTIONS"}
        unknown = await open_api.options("/nowhere")
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "unknown_url"


async def test_allowed_origin_gets_preflight_and_responses(app_only: httpx.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        preflight = await app_only.options(
            "/v1/chat/completions", headers={"Origin": APP, **PREFLIGHT}
        )
        assert preflight.status_code == 204
        assert preflight.headers["Access-Control-Allow-Origin"] == APP
        assert preflight.headers["Access-Control-Allow-Methods"] == "OPTIONS, POST"
        assert (
            preflight.headers["Access-Control-Allow-Headers"]
            == (PREFLIGHT["Access-Control-Request-Headers"])
        )
        assert int(preflight.headers["Access-Control-Max-Age"]) > 0
        for response in (
            await app_only.post("/v1/chat/completions", json=CHAT, headers={"Origin": APP}),
            await app_only.get("/v1/models/nope", headers={"Origin": APP}),  # errors too
        ):
            assert response.headers["Access-Control-Allow-Origin"] == APP
            assert "Origin" in response.headers["Vary"]
            # A page may read when to retry, and the key to retry a placement under.
            exposed = response.headers["Access-Control-Expose-Headers"]
            assert {h.strip() for h in exposed.split(",")} == {"Idempotency-Key", "Retry-After"}
        assert response.status_code == 404


async def test_other_origins_are_not_allowed(app_only: httpx.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        preflight = await app_only.options(
            "/v1/chat/completions", headers={"Origin": OTHER, **PREFLIGHT}
        )
        assert preflight.status_code == 204
        assert "access-control-allow-origin" not in preflight.headers
        assert "access-control-allow-methods" not in preflight.headers
        response = await app_only.get("/v1/models", headers={"Origin": OTHER})
        assert response.status_code == 403
        assert "access-control-allow-origin" not in response.headers
        assert "Origin" in response.headers["Vary"]  # caches must not reuse APP's answer


async def test_any_origin(nursery: trio.Nursery) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with httpx.AsyncClient(base_url=await serve(nursery, ("*",))) as http:
            response = await http.get("/health", headers={"Origin": OTHER})
            assert response.headers["Access-Control-Allow-Origin"] == "*"
