"""End to end: a real `trexo run` process, the real runner, the official openai client."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import suppress
from pathlib import Path

import httpx
import openai
import psutil
import pytest
import trio

from tests.waiting import NotYet, wait_until
from trexo import catalog, wire
from trexo.master.session_store import read_session, stored_sessions
from trexo.runner.hooks import HOOKS_ENV
from trexo.state import apply
from trexo.types.events import TaskCreated
from trexo.types.state import State

from .harness import TrexoProcess, run_trexo, stop

MODEL = "trexo-demo-tiny"
TIMEOUT_S = 60.0
GONE_BOUND_S = 10.0
MESSAGES = [{"role": "user", "content": "Explain the for statement."}]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "trio"


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[TrexoProcess]:
    async with run_trexo(tmp_path / "node") as node:
        yield node


def client(node: TrexoProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0)


async def stream_text(c: openai.AsyncOpenAI, **kwargs: object) -> tuple[str, list[object]]:
    chunks = []
    text = ""
    stream = await c.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, **kwargs)  # type: ignore[call-overload]
    async for chunk in stream:
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    return text, chunks


async def test_streaming_and_non_streaming_agree_and_count_usage(node: TrexoProcess) -> None:
    c = client(node)
    with trio.fail_after(TIMEOUT_S):
        full = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=30)  # type: ignore[arg-type]
        text, chunks = await stream_text(c, max_tokens=30, stream_options={"include_usage": True})
    assert full.choices[0].message.content == text
    assert full.usage is not None
    assert full.usage.completion_tokens <= 30
    usage = chunks[-1].usage  # type: ignore[attr-defined]
    assert usage is not None
    assert usage.completion_tokens == full.usage.completion_tokens
    assert usage.prompt_tokens == full.usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    content_chunks = [ch for ch in chunks if ch.choices and ch.choices[0].delta.content]  # type: ignore[attr-defined]
    assert 0 < len(content_chunks) <= usage.completion_tokens


async def test_greedy_output_is_deterministic(node: TrexoProcess) -> None:
    c = client(node)
    with trio.fail_after(TIMEOUT_S):
        first = await c.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=25, temperature=0
        )  # type: ignore[arg-type]
        second = await c.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=25, temperature=0
        )  # type: ignore[arg-type]
    assert first.choices[0].message.content == second.choices[0].message.content
    assert first.choices[0].message.content


async def test_max_tokens_and_stop_are_honoured(node: TrexoProcess) -> None:
    c = client(node)
    with trio.fail_after(TIMEOUT_S):
        long = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=40)  # type: ignore[arg-type]
        text = long.choices[0].message.content or ""
        short = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)  # type: ignore[arg-type]
        assert short.usage is not None
        assert short.usage.completion_tokens == 3
        assert short.choices[0].finish_reason == "length"
        assert text.startswith(short.choices[0].message.content or "")
        stop_at = text[len(text) // 2 :][:4]
        assert stop_at.strip(), f"need some text to stop on: {text!r}"
        stopped = await c.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=40, stop=[stop_at]
        )  # type: ignore[arg-type]
    assert stopped.choices[0].message.content == text[: text.index(stop_at)]
    assert stopped.choices[0].finish_reason == "stop"


async def test_four_simultaneous_streams_all_complete_correctly(node: TrexoProcess) -> None:
    c = client(node)
    with trio.fail_after(TIMEOUT_S):
        alone = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20)  # type: ignore[arg-type]
        results: list[str] = []

        async def one() -> None:
            text, _ = await stream_text(c, max_tokens=20)
            results.append(text)

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(one)
    assert results == [alone.choices[0].message.content] * 4


async def test_bad_input_gets_openai_style_errors_and_the_server_keeps_serving(
    node: TrexoProcess,
) -> None:
    url = f"{node.url}/v1/chat/completions"
    ok = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2}
    cases: list[tuple[dict[str, object], int]] = [
        ({"content": b"{not json"}, 400),
        ({"json": {"model": MODEL}}, 400),
        ({"json": {**ok, "messages": "hello"}}, 400),
        ({"json": {**ok, "max_tokens": "many"}}, 400),
        ({"json": {**ok, "max_tokens": -1}}, 400),
        ({"json": {**ok, "model": "no-such-model"}}, 404),
        ({"content": b"x" * (64 * 1024 * 1024)}, 413),
    ]
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
        for request, status in cases:
            response = await http.post(url, headers={"Content-Type": "application/json"}, **request)  # type: ignore[arg-type]
            assert response.status_code == status, (request.keys(), response.text[:200])
            error = response.json()["error"]
            assert set(error) >= {"message", "type", "param", "code"}
            assert error["message"]
            served = await http.post(url, json=ok)
            assert served.status_code == 200, served.text


async def test_a_client_that_disconnects_cancels_its_generation(tmp_path: Path) -> None:
    # 2000 tokens at 50 ms a step would hold the runner for 100 s if the cancel were lost.
    env = {HOOKS_ENV: "step_delay=0.05"}
    async with run_trexo(tmp_path / "node", env=env) as node:
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2000, "stream": True}
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            with trio.fail_after(TIMEOUT_S):
                async with http.stream(
                    "POST", f"{node.url}/v1/chat/completions", json=body
                ) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data:"):
                            request_id = json.loads(line.removeprefix("data:"))["id"]
                            break  # and disconnect
                # The task leaves the state (the cancel went through the master) ...

                async def no_tasks() -> bool:
                    return not (await http.get(f"{node.url}/state")).json()["tasks"]

                await wait_until(no_tasks, timeout=TIMEOUT_S, what="no task in the state")
                # ... and the runner is free again: the next request does not wait 100 s.
                quick = await http.post(
                    f"{node.url}/v1/chat/completions",
                    json={"model": MODEL, "messages": MESSAGES, "max_tokens": 2},
                )
        assert quick.status_code == 200, quick.text
        # The disconnect may reach the runner before or during the generation (or the
        # worker may never forward it); whichever, it never ran to its length.
        ended = [line for line in node.runner_logs().splitlines() if request_id in line]
        assert all("finished: cancelled" in line for line in ended if "finished" in line), ended


def still_running(pids: list[int]) -> list[int]:
    running = []
    for pid in pids:
        with suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
    return running


async def wait_gone(pids: list[int]) -> None:
    await wait_until(
        lambda: not still_running(pids) or NotYet(still_running(pids)),
        timeout=GONE_BOUND_S,
        what="the runners gone",
    )


async def test_sigint_stops_the_node_and_its_runner(tmp_path: Path) -> None:
    async with run_trexo(tmp_path / "node") as node:
        runners = node.runner_pids()
        assert runners, "the default model's runner should be running"
        await stop(node, signal.SIGINT)
        assert node.process.returncode == 0, node.log_text()[-2000:]
        await wait_gone(runners)


async def test_sigkill_of_the_node_takes_its_runner_too(tmp_path: Path) -> None:
    async with run_trexo(tmp_path / "node") as node:
        runners = node.runner_pids()
        assert runners
        os.kill(node.pid, signal.SIGKILL)
        await node.process.wait()
        await wait_gone(runners)


async def test_the_event_log_reads_back_into_the_served_state_without_the_prompt(
    node: TrexoProcess,
) -> None:
    secret = "The user's own words, 7f3a9c, are nobody's history."
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
        answered = await http.post(
            f"{node.url}/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": secret}],
                "max_tokens": 2,
            },
        )
        assert answered.status_code == 200, answered.text
        served = (await http.get(f"{node.url}/state")).json()
    ((session, directory),) = stored_sessions(node.data_dir / "events")
    stored = read_session(directory, session)
    assert stored.snapshot is None  # far fewer events than a snapshot takes
    events = stored.events
    assert [e.index for e in events] == list(range(len(events)))
    state = State()
    for event in events[: served["last_index"] + 1]:  # more may have come since
        state = apply(state, event)
    assert json.loads(wire.to_json(state, State)) == served
    # The task was logged; what the user typed was not, nor is it in the state.
    assert any(isinstance(e.event, TaskCreated) for e in events)
    for file in directory.iterdir():
        assert b"7f3a9c" not in file.read_bytes()
    assert "7f3a9c" not in json.dumps(served)


async def test_deleting_an_instance_stops_and_reaps_its_runner(node: TrexoProcess) -> None:
    runners = node.runner_pids()
    assert runners
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
        (instance_id,) = (await http.get(f"{node.url}/state")).json()["instances"]
        deleted = await http.delete(f"{node.url}/instances/{instance_id}")
        assert deleted.status_code == 200, deleted.text
        await wait_gone(runners)
        state = (await http.get(f"{node.url}/state")).json()
        assert state["instances"] == {} and state["runners"] == {}
        gone = await http.post(
            f"{node.url}/v1/chat/completions",
            json={"model": MODEL, "messages": MESSAGES, "max_tokens": 2},
        )
        assert gone.status_code == 404
        again = await http.delete(f"{node.url}/instances/{instance_id}")
        assert again.status_code == 404


async def test_a_second_sigint_forces_exit_and_the_runner_still_goes(tmp_path: Path) -> None:
    async with run_trexo(tmp_path / "node") as node:
        runners = node.runner_pids()
        assert runners
        node.process.send_signal(signal.SIGINT)
        await wait_until(  # the first has started the orderly stop
            lambda: "SIGINT: shutting down" in node.log_text(),
            timeout=TIMEOUT_S,
            what="the orderly stop begun",
        )
        node.process.send_signal(signal.SIGINT)
        with trio.fail_after(TIMEOUT_S):
            await node.process.wait()
        assert node.process.returncode in (0, 130)
        await wait_gone(runners)


async def test_models_say_placed_before_ready_and_created_is_stable(tmp_path: Path) -> None:
    env = {HOOKS_ENV: "load_delay=1.5"}
    async with (
        run_trexo(tmp_path / "node", "--no-model", env=env) as node,
        httpx.AsyncClient(timeout=TIMEOUT_S) as http,
    ):
        with trio.fail_after(TIMEOUT_S):
            placed = await http.post(f"{node.url}/instances", json={"model": MODEL})
            assert placed.status_code == 201, placed.text

            async def listing() -> dict[str, object]:
                models = (await http.get(f"{node.url}/v1/models")).json()["data"]
                return next(m for m in models if m["id"] == MODEL)

            loading = await listing()
            assert (loading["placed"], loading["ready"], loading["loaded"]) == (True, False, False)

            async def ready_listing() -> dict[str, object] | NotYet:
                entry = await listing()
                return entry if entry["ready"] else NotYet(entry)

            ready = await wait_until(ready_listing, timeout=TIMEOUT_S, what=f"{MODEL} ready")
            assert ready["loaded"] is True
            served = await http.post(
                f"{node.url}/v1/chat/completions",
                json={"model": MODEL, "messages": MESSAGES, "max_tokens": 2},
            )
            assert served.status_code == 200, served.text
    assert loading["created"] == ready["created"] == catalog.DEMO_MODELS_CREATED


async def test_placing_on_an_unknown_node_is_a_bad_request(node: TrexoProcess) -> None:
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
        response = await http.post(
            f"{node.url}/instances", json={"model": MODEL, "node_id": "no-such-node"}
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("node_not_found", "node_id")
    assert "no-such-node" in error["message"]
