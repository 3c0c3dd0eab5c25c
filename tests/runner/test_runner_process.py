"""A real runner process behind a real `RunnerSupervisor`: load, stream, cancel, stop, fail."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest
import trio

from trexo.config import RunnerConfig
from trexo.errors import LoadFailed, RunnerDied, RunnerError
from trexo.runner.hooks import HOOKS_ENV
from trexo.types.runner_status import RunnerFailed, RunnerReady, RunnerStopped

from .helpers import (
    FAST_STOP,
    chat_request,
    collect,
    in_process_greedy_tokens,
    running_supervisor,
)


async def test_runner_streams_the_same_greedy_tokens_as_mlx_lm(
    tmp_path: Path, tiny_model: Path
) -> None:
    text, max_tokens = "What does the yield statement do?", 40
    async with running_supervisor(tmp_path) as runner:
        await runner.load(tiny_model)
        assert runner.status == RunnerReady()
        chunks = await collect(runner, chat_request(text, max_tokens=max_tokens))
    tokens = [token for chunk in chunks for token in chunk.token_ids]
    expected = in_process_greedy_tokens(tiny_model, text, max_tokens)
    assert tokens == expected[: len(tokens)]
    final = chunks[-1]
    assert final.finish_reason in ("stop", "length")
    assert final.usage is not None
    assert final.usage.completion_tokens == len(expected)


async def test_graceful_stop_is_a_clean_exit(tmp_path: Path, tiny_model: Path) -> None:
    async with running_supervisor(tmp_path) as runner:
        await runner.load(tiny_model)
    assert runner.stop_step == "shutdown"
    assert runner.exit_cause == "exit code 0 (clean exit)"
    assert runner.status == RunnerStopped("exit code 0 (clean exit)")


async def test_runner_output_goes_to_its_log_file_and_the_node_log(
    tmp_path: Path, tiny_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running_supervisor(tmp_path) as runner:
        await runner.load(tiny_model)
    log_text = (tmp_path / "logs" / "test-runner.log").read_text()
    assert f"model {tiny_model} loaded" in log_text
    assert any(
        "[runner test-run] " in r.getMessage() and "loaded" in r.getMessage()
        for r in caplog.records
    )


async def test_load_failure_is_reported_with_its_cause(tmp_path: Path) -> None:
    async with running_supervisor(tmp_path) as runner:
        with pytest.raises(LoadFailed, match="load failed"):
            await runner.load(tmp_path / "no-such-model")
        assert isinstance(runner.status, RunnerFailed)


async def test_generate_before_load_fails_that_request_only(tmp_path: Path) -> None:
    async with running_supervisor(tmp_path) as runner:
        with pytest.raises(RunnerError, match="no model is loaded"):
            await collect(runner, chat_request(max_tokens=5))


async def test_cancel_stops_a_generation_within_a_step(tmp_path: Path, tiny_model: Path) -> None:
    env = {HOOKS_ENV: "step_delay=0.05"}
    async with running_supervisor(tmp_path, env=env) as runner:
        await runner.load(tiny_model)
        request = chat_request(max_tokens=2000)
        received_after_cancel = 0
        cancelled = False
        async with runner.open_generation(request) as stream:
            async for chunk in stream:
                if cancelled:
                    received_after_cancel += 1
                elif chunk.token_ids:
                    await runner.cancel(request.request_id)
                    cancelled = True
        assert chunk.finish_reason == "cancelled"
        # The step in progress when Cancel arrived, plus the final chunk.
        assert received_after_cancel <= 3
        assert chunk.usage is not None
        assert chunk.usage.completion_tokens < 10
        # The runner is free again and serves the next request.
        again = await collect(runner, chat_request(max_tokens=3))
        assert again[-1].finish_reason in ("stop", "length")


async def test_leaving_the_stream_early_cancels_it_in_the_runner(
    tmp_path: Path, tiny_model: Path
) -> None:
    env = {HOOKS_ENV: "step_delay=0.05"}
    async with running_supervisor(tmp_path, env=env) as runner:
        await runner.load(tiny_model)
        async with runner.open_generation(chat_request(max_tokens=2000)) as stream:
            async for _ in stream:
                break
        with trio.fail_after(10):
            await runner.wait_status(lambda s: s == RunnerReady())


async def test_sigkill_mid_generation_fails_inflight_requests_with_the_cause(
    tmp_path: Path, tiny_model: Path
) -> None:
    env = {HOOKS_ENV: "step_delay=0.05"}
    async with running_supervisor(tmp_path, env=env) as runner:
        await runner.load(tiny_model)
        assert runner.pid is not None
        with pytest.raises(RunnerDied, match="SIGKILL"):
            async with runner.open_generation(chat_request(max_tokens=2000)) as stream:
                async for _ in stream:
                    os.kill(runner.pid, signal.SIGKILL)
        with trio.fail_after(10):
            await runner.wait_status(lambda s: False)  # returns on the terminal status
    assert runner.status == RunnerFailed("SIGKILL")
    assert runner.exit_cause == "SIGKILL"


async def test_a_runner_that_ignores_shutdown_is_escalated_to_sigkill(
    tmp_path: Path, tiny_model: Path
) -> None:
    config = RunnerConfig(shutdown_grace=0.3, term_grace=0.3, kill_grace=5.0)
    env = {HOOKS_ENV: "ignore_shutdown"}
    async with running_supervisor(tmp_path, config=config, env=env) as runner:
        await runner.load(tiny_model)
        started = trio.current_time()
    elapsed = trio.current_time() - started
    assert runner.stop_step == "SIGKILL"
    assert runner.exit_cause == "SIGKILL"
    assert isinstance(runner.status, RunnerStopped)
    assert elapsed < config.stop_bound + 2.0


async def test_garbage_from_the_runner_stops_it_with_a_log_line(
    tmp_path: Path, tiny_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = {HOOKS_ENV: "garbage_after_ready"}
    async with running_supervisor(tmp_path, config=FAST_STOP, env=env) as runner:
        await runner.load(tiny_model)  # ready arrives first, then the garbage
        with trio.fail_after(10):
            await runner.wait_status(lambda s: False)  # returns on the terminal status
    assert isinstance(runner.status, RunnerFailed)
    assert "protocol error: not valid JSON" in runner.status.cause
    assert any("protocol error from runner" in r.getMessage() for r in caplog.records)
