"""One request cannot hold the runner hostage; a degraded node says so. Real `trexo run`."""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.waiting import wait_until
from trexo.runner.hooks import HOOKS_ENV

from .harness import TrexoProcess, run_trexo

MODEL = "trexo-demo-tiny"
TIMEOUT_S = 60.0
CONTEXT = 4096
"""The tiny demo model's `max_position_embeddings`."""
LONG_LINE = "for x in range(10): pass\n"
UNCANCELLED_PREFILL_S = 50.0
"""How much longer than a short chat the slowed prefill of the disconnect test takes."""


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


@pytest.fixture
async def node(tmp_path: Path) -> Any:
    async with run_trexo(tmp_path / "node") as node:
        yield node


async def test_a_prompt_over_the_context_is_a_fast_400_and_the_node_keeps_serving(
    node: TrexoProcess,
) -> None:
    async with httpx.AsyncClient(base_url=node.url, timeout=TIMEOUT_S) as http:
        with trio.fail_after(TIMEOUT_S):
            too_long = await http.post("/v1/chat/completions", json=chat(LONG_LINE * 1000))
            assert too_long.status_code == 400, too_long.text
            error = too_long.json()["error"]
            assert error["code"] == "context_length_exceeded"
            assert f"maximum context length is {CONTEXT} tokens" in error["message"]
            prompt_tokens = int(error["message"].split("resulted in ")[1].split()[0])
            assert prompt_tokens > CONTEXT

            # A limit past the context is capped to the room the prompt leaves.
            capped = await http.post(
                "/v1/chat/completions", json=chat("Hello", max_tokens=CONTEXT, temperature=0)
            )
            assert capped.status_code == 200, capped.text

            served = await http.post("/v1/chat/completions", json=chat("Hello", max_tokens=3))
            assert served.status_code == 200, served.text
    await wait_until(  # the runner's log reaches its file a moment later
        lambda: node.runner_logs().count("finished:") == 2,
        timeout=TIMEOUT_S,
        what="two finished lines",
    )
    assert node.runner_logs().count("finished:") == 2  # the refused one never reached it


async def test_a_disconnect_mid_prefill_frees_the_runner_at_once(tmp_path: Path) -> None:
    # 0.5 s per stop check and 32-token prefill steps: the ~3,600-token prompt takes ~56 s
    # to read, a short chat ~2 s (one prefill check, two decode checks).
    env = {HOOKS_ENV: "stop_check_delay=0.5"}
    async with (
        run_trexo(tmp_path / "node", "--prefill-step", "32", env=env) as node,
        httpx.AsyncClient(base_url=node.url, timeout=TIMEOUT_S) as http,
    ):
        long = chat(LONG_LINE * 300, max_tokens=5, stream=True)
        with trio.fail_after(TIMEOUT_S):
            async with http.stream("POST", "/v1/chat/completions", json=long) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        request_id = json.loads(line.removeprefix("data:"))["id"]
                        break
                await wait_until(runner_running(http), timeout=TIMEOUT_S, what="the prefill")
            # Disconnected while the runner reads the prompt.
            started = trio.current_time()
            quick = await http.post("/v1/chat/completions", json=chat("Hi", max_tokens=2))
            waited = trio.current_time() - started
        assert quick.status_code == 200, quick.text
        # Behind an uncancelled prefill it would wait ~50 s more; a bound far from both
        # holds on a loaded machine and still catches the prefill that was not cut short.
        assert waited < UNCANCELLED_PREFILL_S / 2, waited
        ended = [line for line in node.runner_logs().splitlines() if request_id in line]
        assert any("finished: cancelled" in line for line in ended), ended


async def test_a_client_that_stops_reading_is_cancelled(tmp_path: Path) -> None:
    async with run_trexo(tmp_path / "node", "--stalled-client-timeout", "1") as node:
        host, port = node.url.removeprefix("http://").split(":")
        body = json.dumps(chat("Hello", max_tokens=CONTEXT - 100, stream=True)).encode()
        request = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        sock = trio.socket.socket()
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills fast
            await sock.connect((host, int(port)))
            await sock.send(request)
            # Never read. The runner must see the cancel long before ~4,000 tokens are done.

            def cancelled() -> bool:
                logs = node.runner_logs()
                assert "finished: length" not in logs, "it ran to its end"
                return "finished: cancelled" in logs

            await wait_until(cancelled, timeout=TIMEOUT_S, what="the generation cancelled")
        assert "has not read for 1 s; treated as disconnected" in node.log_text()
        async with httpx.AsyncClient(base_url=node.url, timeout=TIMEOUT_S) as http:
            with trio.fail_after(TIMEOUT_S):
                served = await http.post("/v1/chat/completions", json=chat("Hi", max_tokens=2))
        assert served.status_code == 200, served.text


async def wait_runner(node: TrexoProcess, old: set[int]) -> int:
    """The pid of a runner other than `old` (the restarted one)."""
    new = await wait_until(
        lambda: set(node.runner_pids()) - old, timeout=TIMEOUT_S, what="a new runner"
    )
    (pid,) = new
    return pid


def runner_running(http: httpx.AsyncClient) -> Callable[[], Awaitable[bool]]:
    """A check: whether the state shows a runner with a generation in hand."""

    async def check() -> bool:
        return "RunnerRunning" in json.dumps((await http.get("/state")).json())

    return check


async def test_a_runner_killed_again_and_again_gets_503s_while_down_and_heals(
    node: TrexoProcess,
) -> None:
    async with httpx.AsyncClient(base_url=node.url, timeout=TIMEOUT_S) as http:
        (pid,) = node.runner_pids()
        for _ in range(3):
            os.kill(pid, signal.SIGKILL)
            with trio.fail_after(TIMEOUT_S):
                # Down: 503 with Retry-After and the reason; /health degraded; not ready.
                async def refused() -> httpx.Response | None:
                    down = await http.post("/v1/chat/completions", json=chat("Hi", max_tokens=2))
                    # 200 before the death is seen; 503 from the dead runner, then from the
                    # API's own check once the state says it is down.
                    assert down.status_code in (200, 503), down.text
                    return down if down.status_code == 503 and "cannot serve" in down.text else None

                down = await wait_until(refused, timeout=TIMEOUT_S, what="a 503 'cannot serve'")
                assert int(down.headers["retry-after"]) >= 1
                error = down.json()["error"]
                assert error["code"] == "model_unavailable"
                assert f"model {MODEL} cannot serve right now" in error["message"]
                health = (await http.get("/health")).json()
                assert health["status"] == "degraded", health
                assert any(MODEL in problem for problem in health["problems"]), health
                models = (await http.get("/v1/models")).json()["data"]
                assert next(m for m in models if m["id"] == MODEL)["ready"] is False
                # Heals by itself: a new runner, served again, healthy again.
                pid = await wait_runner(node, {pid})

                async def healthy() -> bool:
                    return bool((await http.get("/health")).json()["status"] == "ok")

                await wait_until(healthy, timeout=TIMEOUT_S, what="/health ok again")
                served = await http.post("/v1/chat/completions", json=chat("Hi", max_tokens=2))
                assert served.status_code == 200, served.text
        log = node.log_text()
        assert log.count("restarting in") >= 3
        assert log.count("ended unexpectedly: SIGKILL") == 3
        stopped = [line for line in log.splitlines() if "stopped by" in line]
        assert stopped == []  # nothing stopped them: they were killed


async def test_a_request_in_flight_when_its_runner_dies_is_a_503(tmp_path: Path) -> None:
    env = {HOOKS_ENV: "step_delay=0.05"}
    async with (
        run_trexo(tmp_path / "node", env=env) as node,
        httpx.AsyncClient(base_url=node.url, timeout=TIMEOUT_S) as http,
    ):
        (pid,) = node.runner_pids()
        with trio.fail_after(TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                responses: list[httpx.Response] = []

                async def slow() -> None:
                    body = chat("Hello", max_tokens=1000)
                    responses.append(await http.post("/v1/chat/completions", json=body))

                nursery.start_soon(slow)
                await wait_until(runner_running(http), timeout=TIMEOUT_S, what="the generation")
                os.kill(pid, signal.SIGKILL)
        (response,) = responses
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"]
        assert response.json()["error"]["code"] == "model_unavailable"
