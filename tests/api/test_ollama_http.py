"""The Ollama API against a real server over the scripted fake node: the official `ollama`
client, raw NDJSON, errors in Ollama's shape, and the second listener. What every dialect does
alike (disconnects, cancel by id, no keep-alive lines in NDJSON) is in `test_streaming_http`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import ollama
import pytest
import trio

from trexo import __version__
from trexo.api.app import create_app
from trexo.api.ollama_api import OLLAMA_API_VERSION
from trexo.api.server import ApiServer
from trexo.config import ApiConfig
from trexo.errors import GenerationFailed
from trexo.types.chunks import Usage

from .conftest import CLIENT_TIMEOUT_S
from .dialects import NDJSON, ndjson_lines, read_stream
from .fake_node import DEMO, OTHER, FakeNode, Step

TEST_TIMEOUT_S = 30.0
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def client(api_url: str) -> AsyncIterator[ollama.AsyncClient]:
    async with ollama.AsyncClient(host=api_url, timeout=CLIENT_TIMEOUT_S) as client:
        yield client


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": DEMO.model_id, "messages": MESSAGES, **extra}


async def read_lines(
    http: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> tuple[int, list[Any]]:
    """The status and JSON lines of an NDJSON response; every line must be JSON."""
    status, raw = await read_stream(http, path, body, NDJSON)
    return status, ndjson_lines(raw)


def assert_error(response: httpx.Response, status: int) -> str:
    """An error in Ollama's shape: `{"error": message}` and nothing else."""
    assert response.status_code == status, response.text
    body = response.json()
    assert list(body) == ["error"]
    assert isinstance(body["error"], str)
    assert body["error"]
    return str(body["error"])


# --- generation ----------------------------------------------------------------------------------


async def test_chat_not_streamed(client: ollama.AsyncClient, node: FakeNode) -> None:
    options = {"temperature": 0.5, "num_predict": 7, "seed": 3, "num_ctx": 4096}
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await client.chat(model=DEMO.model_id, messages=MESSAGES, options=options)
    assert response.model == DEMO.model_id
    assert response.message.role == "assistant"
    assert response.message.content == "Hello world!"
    assert (response.done, response.done_reason) == (True, "stop")
    assert (response.prompt_eval_count, response.eval_count) == (5, 3)
    assert response.total_duration is not None
    assert response.total_duration > 0
    [(model_id, request)] = node.requests
    assert model_id == DEMO.model_id
    params = request.params
    assert (params.temperature, params.max_tokens, params.seed) == (0.5, 7, 3)
    assert node.exits[request.request_id] == "completed"


async def test_a_whole_answer_is_timed_as_a_stream_is(
    client: ollama.AsyncClient, node: FakeNode
) -> None:
    # Clients divide eval_count by eval_duration: a whole answer must measure both parts.
    node.script = (
        Step(delay=0.05, text="Hello"),
        Step(
            delay=0.05, text="!", finish="stop", usage=Usage(prompt_tokens=5, completion_tokens=2)
        ),
    )
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await client.chat(model=DEMO.model_id, messages=MESSAGES)
    assert response.prompt_eval_duration is not None and response.eval_duration is not None
    assert response.prompt_eval_duration >= 40_000_000  # the first token's wait
    assert response.eval_duration >= 40_000_000  # the rest
    assert response.total_duration == response.prompt_eval_duration + response.eval_duration


async def test_chat_streamed(client: ollama.AsyncClient, node: FakeNode) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        parts = [
            part
            async for part in await client.chat(model=DEMO.model_id, messages=MESSAGES, stream=True)
        ]
    *deltas, done = parts
    assert "".join(part.message.content or "" for part in deltas) == "Hello world!"
    assert not any(part.done for part in deltas)
    assert (done.done, done.done_reason, done.eval_count) == (True, "stop", 3)
    assert done.total_duration == (done.prompt_eval_duration or 0) + (done.eval_duration or 0)
    assert done.eval_duration is not None
    assert done.eval_duration > 0
    assert node.exits[node.only_request_id()] == "completed"


LINE_SEPARATORS = "a\u2028b\u2029c\u0085d"


async def test_generated_line_separators_reach_the_ollama_client_intact(
    client: ollama.AsyncClient, node: FakeNode
) -> None:
    # httpx's iter_lines (the client's reader) splits at U+2028, U+2029 and U+0085: written
    # raw, they cut a line of the stream in two and the client fails to decode it.
    node.script = (Step(text=LINE_SEPARATORS), Step(text="!", finish="stop"))
    with trio.fail_after(TEST_TIMEOUT_S):
        parts = [
            part
            async for part in await client.chat(model=DEMO.model_id, messages=MESSAGES, stream=True)
        ]
        whole = await client.chat(model=DEMO.model_id, messages=MESSAGES)
    assert "".join(part.message.content or "" for part in parts) == LINE_SEPARATORS + "!"
    assert whole.message.content == LINE_SEPARATORS + "!"


async def test_generate_streamed_and_not(client: ollama.AsyncClient, node: FakeNode) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        whole = await client.generate(model=DEMO.model_id, prompt="hi", system="Be kind.")
        parts = [
            part
            async for part in await client.generate(
                model=DEMO.model_id, prompt="raw text", raw=True, stream=True
            )
        ]
    assert (whole.response, whole.done_reason) == ("Hello world!", "stop")
    assert "".join(part.response or "" for part in parts) == "Hello world!"
    assert parts[-1].done
    (_, templated), (_, raw) = node.requests
    assert [m.role for m in templated.messages or ()] == ["system", "user"]
    assert (raw.messages, raw.prompt) == (None, "raw text")


async def test_stream_is_the_default_and_is_ndjson(http: httpx.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        status, lines = await read_lines(http, "/api/chat", chat())  # NDJSON, or it fails
    assert status == 200
    assert [line["message"]["content"] for line in lines] == ["Hello", " world", "!", ""]
    assert [line["done"] for line in lines] == [False, False, False, True]


async def test_the_latest_tag_finds_the_model(client: ollama.AsyncClient, node: FakeNode) -> None:
    name = f"{DEMO.model_id}:latest"
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await client.chat(model=name, messages=MESSAGES)
    assert response.model == name  # echoed as the client named it
    [(model_id, _)] = node.requests
    assert model_id == DEMO.model_id


async def test_load_requests_answer_at_once(http: httpx.AsyncClient, node: FakeNode) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        chat_load = await http.post("/api/chat", json={"model": DEMO.model_id, "messages": []})
        generate_load = await http.post("/api/generate", json={"model": DEMO.model_id})
        unknown = await http.post("/api/generate", json={"model": "nope"})
        not_placed = await http.post("/api/chat", json={"model": OTHER.model_id})
    assert chat_load.status_code == generate_load.status_code == 200
    assert (chat_load.json()["done"], chat_load.json()["done_reason"]) == (True, "load")
    assert generate_load.json()["response"] == ""
    assert node.requests == []
    assert "nope" in assert_error(unknown, 404)
    assert "POST /instances" in assert_error(not_placed, 503)


# --- models --------------------------------------------------------------------------------------


async def test_list_show_ps_and_version(
    client: ollama.AsyncClient, http: httpx.AsyncClient
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        listed = await client.list()
        shown = await client.show(DEMO.model_id)
        running = await client.ps()
        version = (await http.get("/api/version")).json()
        with pytest.raises(ollama.ResponseError) as unknown:
            await client.show("nope")
    assert {model.model for model in listed.models} == {"demo-tiny", "org/other-model", "too-big"}
    assert shown.modelinfo is not None
    assert shown.modelinfo["trexo.source"] == DEMO.source
    assert [model.model for model in running.models] == [DEMO.model_id]  # the placed one
    # The Ollama release whose API trexo follows (clients compare it), trexo's own apart.
    assert version == {"version": OLLAMA_API_VERSION, "trexo_version": __version__}
    assert unknown.value.status_code == 404


# --- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/api/chat", {"model": DEMO.model_id, "messages": [{"role": "bot"}]}, 400),
        ("/api/chat", chat(options={"stop": [3]}), 400),
        ("/api/chat", chat(think="maximal"), 400),
        ("/api/generate", {"model": DEMO.model_id, "prompt": "x", "suffix": "y"}, 400),
        ("/api/generate", {"prompt": "x"}, 400),
        ("/api/show", {}, 400),
        ("/api/chat", {"model": "nope", "messages": MESSAGES}, 404),
    ],
)
async def test_bad_requests_get_ollamas_error_shape(
    http: httpx.AsyncClient, node: FakeNode, path: str, body: dict[str, Any], status: int
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        assert_error(await http.post(path, json=body), status)
        # The node keeps serving.
        _, lines = await read_lines(http, "/api/chat", chat())
    assert lines[-1]["done"] is True
    assert len(node.requests) == 1


async def test_http_level_errors_get_ollamas_error_shape(http: httpx.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        not_json = await http.post(
            "/api/chat", content=b"{nope", headers={"content-type": "application/json"}
        )
        no_such_url = await http.get("/api/nope")
        wrong_method = await http.get("/api/chat")
        outside = await http.get("/v1/nope")
    assert_error(not_json, 400)
    assert_error(no_such_url, 404)
    assert_error(wrong_method, 405)
    assert outside.json()["error"]["code"] == "unknown_url"  # OpenAI's shape outside /api/


async def test_no_session_is_503(http: httpx.AsyncClient, node: FakeNode) -> None:
    node.no_session = True
    with trio.fail_after(TEST_TIMEOUT_S):
        assert_error(await http.post("/api/chat", json=chat(stream=False)), 503)
        assert_error(await http.post("/api/chat", json=chat()), 503)


async def test_the_client_raises_on_a_bad_request(client: ollama.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        with pytest.raises(ollama.ResponseError) as caught:
            await client.chat(model=DEMO.model_id, messages=MESSAGES, options={"top_k": "x"})
        assert caught.value.status_code == 400
        assert "options.top_k" in caught.value.error
        assert (await client.chat(model=DEMO.model_id, messages=MESSAGES)).done


async def test_failure_mid_stream_is_a_last_error_line(
    http: httpx.AsyncClient, client: ollama.AsyncClient, node: FakeNode
) -> None:
    node.script = (Step(text="partial"), Step(error=GenerationFailed("runner died: SIGKILL")))
    with trio.fail_after(TEST_TIMEOUT_S):
        status, lines = await read_lines(http, "/api/chat", chat())
        assert status == 200
        assert lines[-1] == {"error": "runner died: SIGKILL"}
        with pytest.raises(ollama.ResponseError, match="runner died"):
            async for _ in await client.chat(model=DEMO.model_id, messages=MESSAGES, stream=True):
                pass


async def test_failure_not_streamed_is_500(http: httpx.AsyncClient, node: FakeNode) -> None:
    node.script = (Step(text="partial"), Step(error=GenerationFailed("runner died")))
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post(
            "/api/generate", json={"model": DEMO.model_id, "prompt": "x", "stream": False}
        )
    assert assert_error(response, 500) == "runner died"


# --- the second listener -------------------------------------------------------------------------


async def test_a_second_listener_serves_the_same_api(nursery: trio.Nursery, node: FakeNode) -> None:
    config = ApiConfig(port=0, ollama_port=0)
    server = ApiServer(create_app(node, config), config)
    with trio.fail_after(TEST_TIMEOUT_S):
        api_url: str = await nursery.start(server.run)
        assert server.urls[0] == api_url
        ollama_url = server.ollama_url
        assert ollama_url is not None
        assert ollama_url != api_url
        async with ollama.AsyncClient(host=ollama_url, timeout=CLIENT_TIMEOUT_S) as client:
            response = await client.chat(model=DEMO.model_id, messages=MESSAGES)
        async with httpx.AsyncClient(base_url=api_url) as http:
            health = await http.get("/health")
            page = await http.get("/")
            on_ollama_port = await http.get(f"{ollama_url}/")
    assert response.message.content == "Hello world!"
    assert health.status_code == 200
    # Ollama's own answer at its port's root, which clients and scripts probe; the dashboard
    # on the API's port.
    assert (on_ollama_port.status_code, on_ollama_port.text) == (200, "Ollama is running")
    assert page.status_code == 200 and "<html" in page.text.lower()


async def test_no_second_listener_by_default(nursery: trio.Nursery, node: FakeNode) -> None:
    config = ApiConfig(port=0)
    server = ApiServer(create_app(node, config), config)
    url: str = await nursery.start(server.run)
    assert (server.urls, server.ollama_url) == ((url,), None)
