"""What a request makes a node compute cannot freeze it, kill its runner or wedge it.

A real `trexo run` serving a copy of the tiny demo model whose chat template raises on a
system turn (as Gemma's does) and loops on a magic word (ten billion empty iterations), and
a hub on loopback that drips its answers a byte at a time. A JSON schema built to explode is
a 400 while the node keeps answering; a template's error is its request's 400 while another
stream goes on; after a flood of both, a command is still carried out and SIGTERM still
stops the node at once.
"""

from __future__ import annotations

import itertools
import json
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.waiting import NotYet, wait_until

from .harness import TrexoProcess, run_trexo

TIMEOUT_S = 180.0
"""Generous: catches hangs only. With several busy processes per core every step here is
many times slower, and a looping template holds its thread for 2 s of its own CPU time,
which is far more by the clock."""
STOP_BOUND_S = 60.0
"""SIGTERM to exit, with a flood in flight (about a second on a quiet machine): catches a
node that does not stop, not a slow one."""
HEALTH_GAP_S = 5.0
"""The longest /health may go unanswered while a hostile schema is checked. A frozen event
loop went silent for the whole compile (17 patterns: ~10 s, 18: 6.5-9 s on a quiet machine,
20: 51 s); checked in its own process, the loop never waits for it."""
PATTERNS = 18
LOOP_WORD = "loop-forever"
TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% if messages[-1]['content'] == '" + LOOP_WORD + "' %}"
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
FLOOD = 45
"""More than trio's 40 default worker threads, of each kind."""
HUB_THREADS = 8
"""The node's hub look-ups at once (`trexo.config.HUB_THREADS`)."""


def hostile_schema(patterns: int = PATTERNS) -> dict[str, Any]:
    """Under 1 KB; each `allOf` pattern multiplies the work of compiling it."""
    rules = [{"pattern": "\\p{L}*" + chr(ord("a") + k)} for k in range(patterns)]
    return {"type": "string", "allOf": rules}


@pytest.fixture(scope="module")
def hostile_model(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    model = tmp_path_factory.mktemp("models") / "hostile-template"
    shutil.copytree(tiny_model, model)
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = TEMPLATE
    config_path.write_text(json.dumps(config))
    return model


def chat(model: Path, *messages: tuple[str, str], **extra: Any) -> dict[str, Any]:
    turns = [{"role": role, "content": content} for role, content in messages]
    return {"model": model.name, "messages": turns, **extra}


class DrippingHub:
    """Answers every request with headers and then a byte every few seconds, forever."""

    def __init__(self) -> None:
        self.connections = 0
        self.url = ""

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        task_status.started(self.url)
        await trio.serve_listeners(self._serve, listeners)

    async def _serve(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        async with stream:
            await stream.receive_some(65536)  # the request: whatever it asks
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            await stream.send_all(head + b"Content-Length: 100000\r\n\r\n")
            while True:
                await stream.send_all(b" ")
                await trio.sleep(2.0)  # the drip is the behaviour under test


@pytest.fixture
async def node(tmp_path: Path, hostile_model: Path) -> AsyncIterator[TrexoProcess]:
    async with run_trexo(tmp_path / "node", "--model", str(hostile_model)) as node:
        yield node


async def test_a_schema_built_to_explode_is_a_400_while_the_node_answers(
    node: TrexoProcess, hostile_model: Path
) -> None:
    schema = hostile_schema()
    assert len(json.dumps(schema)) < 1024
    body = chat(
        hostile_model,
        ("user", "hi"),
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )
    answered: list[float] = []

    async def poll_health(http: httpx.AsyncClient) -> None:
        while True:
            response = await http.get("/health")
            assert response.status_code == 200
            answered.append(trio.current_time())
            await trio.sleep(0.1)

    async with httpx.AsyncClient(base_url=node.url, timeout=TIMEOUT_S) as http:
        with trio.fail_after(TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(poll_health, http)
                await wait_until(lambda: len(answered) > 2, timeout=TIMEOUT_S, what="/health")
                started = trio.current_time()
                refused = await http.post("/v1/chat/completions", json=body)
                ended = trio.current_time()
                await wait_until(lambda: answered[-1] > ended, timeout=TIMEOUT_S, what="/health")
                nursery.cancel_scope.cancel()
        during = [t for t in answered if started - HEALTH_GAP_S <= t <= ended + HEALTH_GAP_S]
        gaps = [b - a for a, b in itertools.pairwise(during)]
        assert max(gaps) < HEALTH_GAP_S, gaps
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == "response_format.json_schema.schema"
        assert "too complex" in error["message"]
        answer = chat(hostile_model, ("user", "hi"), max_tokens=8)  # it serves: a short answer
        served = await http.post("/v1/chat/completions", json=answer)
        assert served.status_code == 200, served.text


async def test_a_template_error_is_its_request_s_400_and_another_stream_goes_on(
    node: TrexoProcess, hostile_model: Path
) -> None:
    runners = node.runner_pids()
    long = chat(hostile_model, ("user", "Tell me a story."), max_tokens=200, stream=True)
    system = chat(hostile_model, ("system", "Be terse."), ("user", "hi"))
    async with httpx.AsyncClient(base_url=node.url, timeout=TIMEOUT_S) as http:
        with trio.fail_after(TIMEOUT_S):
            async with http.stream("POST", "/v1/chat/completions", json=long) as stream:
                lines = stream.aiter_lines()
                async for line in lines:
                    if line.startswith("data:"):
                        break  # it streams
                refused = await http.post("/v1/chat/completions", json=system)
                rest = [line async for line in lines if line.startswith("data:")]
    assert refused.status_code == 400, refused.text
    assert "System role not supported" in refused.json()["error"]["message"]
    finals = [json.loads(line[5:]) for line in rest if line != "data: [DONE]"]
    assert finals[-1]["choices"][0]["finish_reason"] == "length"
    assert node.runner_pids() == runners


async def test_after_a_flood_of_hostile_requests_commands_work_and_sigterm_stops_the_node(
    tmp_path: Path, hostile_model: Path
) -> None:
    hub = DrippingHub()
    async with trio.open_nursery() as hubs:
        await hubs.start(hub.run)
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "", "HF_HUB_CACHE": str(tmp_path / "hf")}
        async with (
            run_trexo(tmp_path / "node", "--model", str(hostile_model), env=env) as node,
            httpx.AsyncClient(
                base_url=node.url, timeout=TIMEOUT_S, limits=httpx.Limits(max_connections=None)
            ) as http,
        ):
            refusals: list[int] = []

            async def hostile(method: str, path: str, body: dict[str, Any]) -> None:
                try:
                    response = await http.request(method, path, json=body)
                except httpx.HTTPError:
                    return  # the node stopped under it
                refusals.append(response.status_code)

            looping = chat(hostile_model, ("user", LOOP_WORD))
            async with trio.open_nursery() as flood:
                for _ in range(FLOOD):
                    flood.start_soon(hostile, "POST", "/v1/chat/completions", looping)
                    flood.start_soon(hostile, "POST", "/instances", {"model": "org/dripping"})
                await wait_until(
                    lambda: hub.connections >= HUB_THREADS or NotYet(hub.connections),
                    timeout=TIMEOUT_S,
                    what="hub look-ups stuck on the dripping hub",
                )
                # A command that the master logs is carried out during the flood.
                with trio.fail_after(TIMEOUT_S):
                    placed = await http.post("/instances", json={"model": "trexo-demo-tiny"})
                assert placed.status_code == 201, placed.text
                await wait_until(
                    lambda: 400 in refusals or NotYet(refusals),
                    timeout=TIMEOUT_S,
                    what="a looping template cut short: its request's 400",
                )
                node.process.send_signal(signal.SIGTERM)
                with trio.fail_after(STOP_BOUND_S):
                    await node.process.wait()
                flood.cancel_scope.cancel()
            assert node.process.returncode == 0, node.log_text()[-2000:]
        hubs.cancel_scope.cancel()
