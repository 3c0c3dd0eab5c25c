"""Web pages cannot use a node: a request whose `Origin` is neither the node's own nor a
configured one is refused, a browser's JSON body must say it is JSON, and `Host` must name
the node (DNS rebinding), on both listeners; clients without an `Origin` (curl, the official
clients) keep working whatever content type they send."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest
import trio
from tls_cert import make_self_signed

from trexo.api.app import create_app
from trexo.api.cross_site import HostNames, parse_host, same_origin
from trexo.api.server import ApiServer
from trexo.cli import build_parser
from trexo.config import ApiConfig

from .fake_node import DEMO, FakeNode
from .raw_http import host_port, request_bytes

TEST_TIMEOUT_S = 30.0
EVIL = "http://evil.example"
APP = "https://app.example"
CHAT = {"model": DEMO.model_id, "messages": [{"role": "user", "content": "hi"}]}
SIMPLE_TYPES = (
    "text/plain",  # fetch(url, {method: "POST", body: "..."}) and <form enctype="text/plain">
    "application/x-www-form-urlencoded",  # a plain <form>
    "multipart/form-data; boundary=x",
)

# Every endpoint that changes something or runs a generation, with a valid body.
STATE_CHANGING = [
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"model": DEMO.model_id, "prompt": "hi"}),
    ("POST", "/v1/responses", {"model": DEMO.model_id, "input": "hi"}),
    (
        "POST",
        "/v1/messages",
        {"model": DEMO.model_id, "max_tokens": 5, "messages": CHAT["messages"]},
    ),
    ("POST", "/v1/messages/count_tokens", {"model": DEMO.model_id, "messages": CHAT["messages"]}),
    ("POST", "/api/chat", {**CHAT, "stream": False}),
    ("POST", "/api/generate", {"model": DEMO.model_id, "prompt": "hi", "stream": False}),
    ("POST", "/api/show", {"model": DEMO.model_id}),
    ("POST", "/instances", {"model": DEMO.model_id}),
    ("DELETE", "/instances/inst-0", None),
    ("POST", "/v1/cancel/x", None),
]
READS = ["/state", "/instances", "/v1/models", "/api/tags", "/health", "/"]


@pytest.fixture
async def node_urls(nursery: trio.Nursery, node: FakeNode) -> tuple[str, str]:
    """The API's URL and its Ollama listener's."""
    config = ApiConfig(port=0, ollama_port=0)
    server = ApiServer(create_app(node, config), config)
    url: str = await nursery.start(server.run)
    assert server.ollama_url is not None
    return url, server.ollama_url


@pytest.fixture
async def http(node_urls: tuple[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=node_urls[0], timeout=TEST_TIMEOUT_S) as client:
        yield client


async def serve(nursery: trio.Nursery, node: FakeNode, config: ApiConfig) -> str:
    url: str = await nursery.start(ApiServer(create_app(node, config), config).run)
    return url


def refused_in_shape(path: str, response: httpx.Response, status: int, code: str) -> bool:
    """Whether `response` is a `status` refusal in the dialect's own error shape."""
    body = response.json()
    if response.status_code != status:
        return False
    if path.startswith("/v1/messages"):
        return body["type"] == "error" and body["error"]["type"] in (
            "permission_error",
            "invalid_request_error",
        )
    if path.startswith("/api/"):
        return set(body) == {"error"} and isinstance(body["error"], str)
    return bool(body["error"]["code"] == code)


async def send(
    http: httpx.AsyncClient,
    method: str,
    path: str,
    body: object,
    headers: dict[str, str],
) -> httpx.Response:
    content = None if body is None else json.dumps(body).encode()
    return await http.request(method, path, content=content, headers=headers)


# --- the Origin rule --------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "body"), STATE_CHANGING)
@pytest.mark.parametrize("content_type", [*SIMPLE_TYPES, "application/json"])
async def test_another_origin_changes_nothing(
    http: httpx.AsyncClient,
    node: FakeNode,
    method: str,
    path: str,
    body: object,
    content_type: str,
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        await http.post("/instances", json={"model": DEMO.model_id})  # something to delete
        placed = len(node.placements)
        response = await send(
            http, method, path, body, {"Origin": EVIL, "Content-Type": content_type}
        )
        assert refused_in_shape(path, response, 403, "origin_not_allowed"), response.text
        assert "access-control-allow-origin" not in response.headers
        assert len(node.placements) == placed and "inst-0" in node.state.instances
        assert node.requests == []


@pytest.mark.parametrize("origin", ["null", "http://127.0.0.1", "https://localhost", "garbage"])
async def test_null_and_lookalike_origins_are_refused(
    http: httpx.AsyncClient, node: FakeNode, origin: str
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post(
            "/instances", content=json.dumps(CHAT), headers={"Origin": origin}
        )
        assert response.status_code == 403, response.text
        assert node.placements == []


@pytest.mark.parametrize("path", READS)
async def test_another_origin_reads_nothing(http: httpx.AsyncClient, path: str) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.get(path, headers={"Origin": EVIL})
        assert response.status_code == 403, response.text
        assert "access-control-allow-origin" not in response.headers


PREVIEW = f"/instances/previews?model={DEMO.model_id}"


@pytest.mark.parametrize("site", ["cross-site", "same-site"])
@pytest.mark.parametrize(
    ("path", "mode", "dest"),
    [
        (PREVIEW, "no-cors", "image"),  # <img src=...>: asks the hub about a model
        (PREVIEW, "navigate", "iframe"),
        (PREVIEW, "navigate", "document"),
        ("/state/events", "no-cors", "script"),
        ("/api/tags", "no-cors", "image"),
        ("/v1/models", "no-cors", "image"),
        ("/dashboard/app.js", "no-cors", "script"),
    ],
)
async def test_what_another_site_loads_without_origin_is_refused(
    http: httpx.AsyncClient, site: str, path: str, mode: str, dest: str
) -> None:
    """Browsers send no `Origin` with a page's images, scripts, frames and links (GETs), but
    they mark them with where they come from (`Sec-Fetch-*`)."""
    headers = {"Sec-Fetch-Site": site, "Sec-Fetch-Mode": mode, "Sec-Fetch-Dest": dest}
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.get(path, headers=headers)
        assert refused_in_shape(path, response, 403, "origin_not_allowed"), response.text


@pytest.mark.parametrize(
    ("path", "site", "mode"),
    [
        ("/", "cross-site", "navigate"),  # a link to the dashboard (another node's page)
        ("/", "same-site", "navigate"),
        (PREVIEW, "same-origin", "cors"),  # what the dashboard asks
        (PREVIEW, "none", "navigate"),  # an address the user typed
        ("/dashboard/app.js", "same-origin", "no-cors"),
    ],
)
async def test_links_to_the_dashboard_and_its_own_requests_are_served(
    http: httpx.AsyncClient, path: str, site: str, mode: str
) -> None:
    headers = {"Sec-Fetch-Site": site, "Sec-Fetch-Mode": mode}
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.get(path, headers=headers)
        assert response.status_code == 200, response.text


async def test_the_nodes_own_page_places_and_chats(
    http: httpx.AsyncClient, node: FakeNode, node_urls: tuple[str, str]
) -> None:
    """What the dashboard sends: its own origin, JSON declared as JSON."""
    own = {"Origin": node_urls[0]}
    with trio.fail_after(TEST_TIMEOUT_S):
        placed = await http.post("/instances", json={"model": DEMO.model_id}, headers=own)
        assert placed.status_code == 201, placed.text
        chat = await http.post("/v1/chat/completions", json=CHAT, headers=own)
        assert chat.status_code == 200, chat.text
        assert (await http.post("/v1/cancel/x", headers=own)).status_code == 404
        assert (await http.delete("/instances/inst-0", headers=own)).status_code == 200
        assert (await http.get("/state", headers=own)).status_code == 200


@pytest.mark.parametrize("content_type", [*SIMPLE_TYPES, None])
async def test_a_browser_must_declare_json(
    http: httpx.AsyncClient, node: FakeNode, node_urls: tuple[str, str], content_type: str | None
) -> None:
    """Even from an allowed origin, a body a browser sends without a preflight (a simple
    content type, or none) is refused: only JSON declared as JSON is read."""
    headers = {"Origin": node_urls[0]}
    if content_type is not None:
        headers["Content-Type"] = content_type
    with trio.fail_after(TEST_TIMEOUT_S):
        for path, body in [("/instances", {"model": DEMO.model_id}), ("/api/chat", CHAT)]:
            response = await http.post(path, content=json.dumps(body), headers=headers)
            assert refused_in_shape(path, response, 415, "unsupported_media_type"), response.text
        assert node.placements == [] and node.requests == []


async def test_configured_origins_may_send_json(nursery: trio.Nursery, node: FakeNode) -> None:
    config = ApiConfig(port=0, cors_origins=(APP,))
    async with httpx.AsyncClient(base_url=await serve(nursery, node, config)) as http:
        with trio.fail_after(TEST_TIMEOUT_S):
            ok = await http.post("/v1/chat/completions", json=CHAT, headers={"Origin": APP})
            assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == APP
            plain = {"Origin": APP, "Content-Type": "text/plain"}
            refused = await http.post(
                "/v1/chat/completions", content=json.dumps(CHAT), headers=plain
            )
            assert refused.status_code == 415
            other = await http.post("/v1/chat/completions", json=CHAT, headers={"Origin": EVIL})
            assert other.status_code == 403


# --- clients without an Origin -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/chat", {**CHAT, "stream": False}),
        ("/api/generate", {"model": DEMO.model_id, "prompt": "hi", "stream": False}),
        ("/v1/chat/completions", CHAT),
        ("/instances", {"model": DEMO.model_id}),
    ],
)
async def test_curl_style_form_encoded_json_still_works(
    http: httpx.AsyncClient, path: str, body: object
) -> None:
    """`curl URL -d '{...}'`, as Ollama's docs show it, sends the JSON as a form."""
    headers = {"Content-Type": "application/x-www-form-urlencoded", "User-Agent": "curl/8.5.0"}
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post(path, content=json.dumps(body), headers=headers)
        assert response.status_code in (200, 201), response.text


async def test_official_clients_work(node_urls: tuple[str, str]) -> None:
    url, ollama_url = node_urls
    with trio.fail_after(TEST_TIMEOUT_S):
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as gpt:
            completion = await gpt.chat.completions.create(
                model=DEMO.model_id, messages=[{"role": "user", "content": "hi"}]
            )
            assert completion.choices[0].message.content == "Hello world!"
        async with anthropic.AsyncAnthropic(base_url=url, api_key="x", max_retries=0) as claude:
            message = await claude.messages.create(
                model=DEMO.model_id, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
            )
            assert message.content[0].type == "text"
        async with ollama.AsyncClient(host=ollama_url) as llama:
            answer = await llama.chat(
                model=DEMO.model_id, messages=[{"role": "user", "content": "hi"}]
            )
            assert answer.message.content == "Hello world!"


# --- the Host rule ------------------------------------------------------------------------------


@pytest.mark.parametrize("which", [0, 1], ids=["api", "ollama"])
@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/state"), ("GET", "/v1/models"), ("GET", "/api/tags"), ("POST", "/instances")],
)
async def test_a_foreign_host_is_refused_on_both_listeners(
    node: FakeNode, node_urls: tuple[str, str], which: int, method: str, path: str
) -> None:
    """DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 is
    'same origin' with the node; its requests name evil.example in `Host`."""
    _, port = host_port(node_urls[which])
    headers = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    async with httpx.AsyncClient(base_url=node_urls[which]) as http:
        with trio.fail_after(TEST_TIMEOUT_S):
            body = {"model": DEMO.model_id} if method == "POST" else None
            without_origin = {"Host": headers["Host"]}
            for sent in (headers, without_origin):
                response = await send(http, method, path, body, sent)
                assert refused_in_shape(path, response, 403, "host_not_allowed"), response.text
            assert node.placements == []


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "LocalHost:{port}",
        "127.0.0.1:{port}",
        "127.1.2.3",
        "[::1]:{port}",
        "app.localhost:{port}",
        "192.168.1.20:{port}",
        "[fd00::1]",
        "mybox.lan:{port}",
    ],
)
async def test_names_of_the_node_are_accepted(
    nursery: trio.Nursery, node: FakeNode, host: str
) -> None:
    config = ApiConfig(port=0, allowed_hosts=("mybox.lan",))
    url = await serve(nursery, node, config)
    _, port = host_port(url)
    async with httpx.AsyncClient(base_url=url) as http:
        with trio.fail_after(TEST_TIMEOUT_S):
            response = await http.get("/state", headers={"Host": host.format(port=port)})
            assert response.status_code == 200, response.text
            other = await http.get("/state", headers={"Host": "other.lan"})
            assert other.status_code == 403


async def test_any_host_when_the_operator_opts_out(nursery: trio.Nursery, node: FakeNode) -> None:
    config = ApiConfig(port=0, allowed_hosts=("*",))
    async with httpx.AsyncClient(base_url=await serve(nursery, node, config)) as http:
        with trio.fail_after(TEST_TIMEOUT_S):
            response = await http.get("/state", headers={"Host": "anything.example"})
            assert response.status_code == 200


async def test_a_bound_name_is_accepted(nursery: trio.Nursery, node: FakeNode) -> None:
    config = ApiConfig(host="localhost", port=0)
    url = await serve(nursery, node, config)
    async with httpx.AsyncClient(base_url=url) as http:
        with trio.fail_after(TEST_TIMEOUT_S):
            assert (await http.get("/state")).status_code == 200


async def test_http10_without_host_is_served(node_urls: tuple[str, str]) -> None:
    """No browser omits `Host`; an HTTP/1.0 client may."""
    host, port = host_port(node_urls[0])
    with trio.fail_after(TEST_TIMEOUT_S):
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            await stream.send_all(request_bytes("GET", "/health", version="1.0"))
            received = b""
            while data := await stream.receive_some():
                received += data
        assert received.startswith(b"HTTP/1.1 200"), received[:200]


async def test_over_https_and_http2(nursery: trio.Nursery, node: FakeNode, tmp_path: Path) -> None:
    """The node's own origin is `https://...` there, and HTTP/2 names the host in
    `:authority`, not `Host`."""
    tls = make_self_signed(tmp_path)
    config = ApiConfig(port=0, tls_cert=tls.cert, tls_key=tls.key)
    url = await serve(nursery, node, config)
    async with httpx.AsyncClient(base_url=url, verify=tls.client_context(), http2=True) as http:
        with trio.fail_after(TEST_TIMEOUT_S):
            own = await http.post(
                "/instances", json={"model": DEMO.model_id}, headers={"Origin": url}
            )
            assert own.status_code == 201 and own.http_version == "HTTP/2", own.text
            plain_origin = url.replace("https", "http")
            other = await http.post(
                "/instances", json={"model": DEMO.model_id}, headers={"Origin": plain_origin}
            )
            assert other.status_code == 403
            rebound = await http.get("/state", headers={"Host": "evil.example"})
            assert rebound.status_code == 403 and rebound.http_version == "HTTP/2"
            assert len(node.placements) == 1


# --- the pure rules -----------------------------------------------------------------------------


def test_parse_host() -> None:
    assert parse_host("LocalHost:8080") == "localhost"
    assert parse_host("[::1]:80") == "::1"
    assert parse_host("127.0.0.1") == "127.0.0.1"
    assert parse_host("example.com.") == "example.com"
    for bad in ("", "a b", "x:notaport", "user@host", "host/path", "[::1"):
        assert parse_host(bad) is None, bad


def test_host_names() -> None:
    names = HostNames(("mybox.lan",), bind="0.0.0.0")
    for good in (
        "localhost",
        "a.localhost",
        "host.docker.internal",
        "10.0.0.1",
        "::1",
        "mybox.lan",
    ):
        assert names.accepts(good), good
    for bad in ("evil.example", "localhost.evil.example", "internal", "mybox.lan.evil", "", None):
        assert not names.accepts(bad), bad
    assert HostNames((), bind="node.lan").accepts("node.lan")
    assert HostNames(("*",), bind="127.0.0.1").accepts("evil.example")
    for machine in ("Studio.local", "studio"):
        assert HostNames(machine=machine).accepts("studio")
        assert HostNames(machine=machine).accepts("studio.local")
        assert not HostNames(machine=machine).accepts("studio.evil.example")


def test_same_origin() -> None:
    assert same_origin("http://127.0.0.1:8080", "http", "127.0.0.1:8080")
    assert same_origin("HTTP://LOCALHOST", "http", "localhost:80")
    assert same_origin("https://node.lan", "https", "node.lan:443")
    assert not same_origin("https://127.0.0.1:8080", "http", "127.0.0.1:8080")
    assert not same_origin("http://127.0.0.1:8081", "http", "127.0.0.1:8080")
    assert not same_origin("null", "http", "127.0.0.1:8080")
    assert not same_origin("http://127.0.0.1:8080", "http", None)


def test_cli_collects_allowed_hosts() -> None:
    args = build_parser().parse_args(
        ["run", "--api-allowed-host", "MyBox.lan", "--api-allowed-host", "*"]
    )
    assert args.api_allowed_host == ["mybox.lan", "*"]
    assert build_parser().parse_args(["run"]).api_allowed_host == []
    for bad in ("http://mybox", "mybox:8080", "a b"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["run", "--api-allowed-host", bad])
