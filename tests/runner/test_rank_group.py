"""A split model over real runner processes on loopback: the same tokens, bounded failures."""

from __future__ import annotations

import logging
import math
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import trio

from tests.waiting import NotYet, wait_until
from trexo.errors import LoadFailed, RequestRejected, RunnerError, RunnerUnavailable
from trexo.runner.hooks import HOOKS_ENV
from trexo.types.ipc import GroupJoined
from trexo.types.runner_status import RunnerFailed, RunnerReady, RunnerStopped
from trexo.types.shard import Sharding
from trexo.worker.runner_supervisor import RunnerSupervisor

from .group_helpers import (
    EXIT_BOUND_S,
    GROUP_CONFIG,
    group_supervisors,
    layer_count,
    load_in_rank_order,
    loopback_group,
    rank_shards,
    running_group,
    tokens_of,
)
from .helpers import TEST_TIMEOUT_S, chat_request, collect, in_process_greedy_tokens

TEXT = "What does the yield statement do?"
MAX_TOKENS = 32
MIN_DISTINCT = 20
"""Of MAX_TOKENS unsharded greedy tokens: a varied output, so that equality means something."""
LONG = 2000
"""max_tokens of a generation that a test interrupts."""
SLOW_STEPS = {HOOKS_ENV: "step_delay=0.02"}
STALL_TIMEOUT_S = 1.5
INIT_TIMEOUT_S = 1.0
REAP_POLL_S = 0.01
CLEAN = "exit code 0 (clean exit)"
BROKEN = "exit code 5 (group broken: a peer rank left)"
STALLED = "exit code 6 (group stalled: a peer rank stopped responding)"


@pytest.mark.parametrize(
    ("world_size", "sharding", "model_fixture"),
    [
        (2, "pipeline", "varied_model"),
        (3, "pipeline", "varied_model"),
        (3, "pipeline", "untied_model"),
        (2, "tensor", "varied_model"),
    ],
)
async def test_split_model_streams_the_unsharded_greedy_tokens(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    world_size: int,
    sharding: Sharding,
    model_fixture: str,
) -> None:
    varied_model: Path = request.getfixturevalue(model_fixture)
    expected = in_process_greedy_tokens(varied_model, TEXT, MAX_TOKENS)
    assert len(set(expected)) >= MIN_DISTINCT
    async with running_group(tmp_path, varied_model, world_size, sharding) as ranks:
        assert all(rank.status == RunnerReady() for rank in ranks)
        assert [rank.joined_group for rank in ranks] == [
            GroupJoined(r, world_size) for r in range(world_size)
        ]
        chunks = await collect(ranks[0], chat_request(TEXT, max_tokens=MAX_TOKENS))
        assert tokens_of(chunks) == expected
        assert chunks[-1].finish_reason == "length"
        again = await collect(ranks[0], chat_request(TEXT, max_tokens=MAX_TOKENS))
        assert tokens_of(again) == expected
    # Stopped together, the ranks end their group at one step: nobody waits on a gone peer.
    # (A rank that hears of a peer leaving before its own Shutdown arrives says so.)
    assert [rank.stop_step for rank in ranks] == ["shutdown"] * world_size
    assert all(rank.exit_cause in (CLEAN, BROKEN) for rank in ranks)


async def test_requests_only_rank_0_can_serve_are_refused_and_the_group_serves_on(
    tmp_path: Path, varied_model: Path
) -> None:
    async with running_group(tmp_path, varied_model, 2) as ranks:
        with pytest.raises(RunnerError, match="rank 1 does not take requests"):
            await collect(ranks[1], chat_request(max_tokens=4))
        with pytest.raises(RequestRejected, match="max_tokens must be at least 1"):
            await collect(ranks[0], chat_request(max_tokens=0))  # every rank refuses it
        chunks = await collect(ranks[0], chat_request(max_tokens=4))
        assert chunks[-1].finish_reason == "length"
        with trio.fail_after(EXIT_BOUND_S):
            for rank in ranks:
                await rank.wait_status(lambda s: s == RunnerReady())


async def test_cancel_mid_generation_ends_it_and_the_group_serves_on(
    tmp_path: Path, varied_model: Path
) -> None:
    expected = in_process_greedy_tokens(varied_model, TEXT, MAX_TOKENS)
    envs = [SLOW_STEPS] * 2
    async with running_group(tmp_path, varied_model, 2, envs=envs) as ranks:
        request = chat_request(TEXT, max_tokens=LONG)
        cancelled = False
        async with ranks[0].open_generation(request) as stream:
            async for chunk in stream:
                if chunk.token_ids and not cancelled:
                    await ranks[0].cancel(request.request_id)
                    cancelled = True
        assert chunk.finish_reason == "cancelled"
        assert chunk.usage is not None
        assert chunk.usage.completion_tokens < 10
        again = await collect(ranks[0], chat_request(TEXT, max_tokens=MAX_TOKENS))
        assert tokens_of(again) == expected
        with trio.fail_after(EXIT_BOUND_S):
            for rank in ranks:
                await rank.wait_status(lambda s: s == RunnerReady())


async def stream_until_first_token_then(
    lead: RunnerSupervisor, act: Callable[[], None], *, max_tokens: int = LONG
) -> None:
    """Stream a long generation from `lead`; call `act` once its first token is in."""
    acted = False
    async with lead.open_generation(chat_request(TEXT, max_tokens=max_tokens)) as stream:
        async for chunk in stream:
            if chunk.token_ids and not acted:
                act()
                acted = True


async def wait_exited(ranks: list[RunnerSupervisor], since: float) -> list[float]:
    """Seconds from `since` until each rank's process had exited and been reaped."""
    exited: dict[int, float] = {}

    def every_rank_reaped() -> bool | NotYet:
        # Not the status: a runner reports a failed load itself, before it exits.
        for k, rank in enumerate(ranks):
            if k not in exited and rank.exit_cause is not None:
                exited[k] = trio.current_time() - since
        return len(exited) == len(ranks) or NotYet([rank.exit_cause for rank in ranks])

    await wait_until(
        every_rank_reaped,
        timeout=GROUP_CONFIG.group_stall_timeout + EXIT_BOUND_S,
        what="every rank reaped",
        poll=REAP_POLL_S,  # the times are measured: to within this
    )
    return [exited[k] for k in range(len(ranks))]


async def test_sigkill_of_a_rank_mid_generation_fails_the_request_and_ends_the_group(
    tmp_path: Path, varied_model: Path
) -> None:
    async with running_group(tmp_path, varied_model, 3, envs=[SLOW_STEPS] * 3) as ranks:
        victim = ranks[1]
        assert victim.pid is not None
        pid, killed_at = victim.pid, math.inf

        def kill() -> None:
            nonlocal killed_at
            killed_at = trio.current_time()
            os.kill(pid, signal.SIGKILL)

        # Mostly the ring raises within milliseconds ("broken"); sometimes a collective queued
        # behind the failed one hangs instead, and the stall watchdog ends it ("stalled").
        with pytest.raises(RunnerUnavailable, match=r"rank group (broken: .*connection|stalled)"):
            await stream_until_first_token_then(ranks[0], kill)
        others = [ranks[0], ranks[2]]
        exited = await wait_exited(others, killed_at)
    assert max(exited) < GROUP_CONFIG.group_stall_timeout + EXIT_BOUND_S
    assert victim.exit_cause == "SIGKILL"
    for rank in others:
        assert rank.exit_cause in (BROKEN, STALLED)
        assert isinstance(rank.status, RunnerFailed)


async def test_sigkill_of_an_idle_rank_0_ends_the_other_ranks(
    tmp_path: Path, varied_model: Path
) -> None:
    async with running_group(tmp_path, varied_model, 2) as ranks:
        assert ranks[0].pid is not None
        killed_at = trio.current_time()
        os.kill(ranks[0].pid, signal.SIGKILL)
        exited = await wait_exited(ranks[1:], killed_at)
    assert exited[0] < GROUP_CONFIG.group_stall_timeout + EXIT_BOUND_S
    assert ranks[1].exit_cause in (BROKEN, STALLED)


async def test_stopping_a_rank_alone_mid_generation_ends_its_group_cleanly(
    tmp_path: Path, varied_model: Path
) -> None:
    async with running_group(tmp_path, varied_model, 3, envs=[SLOW_STEPS] * 3) as ranks:
        stopped_at = math.inf

        def stop_rank_1() -> None:
            nonlocal stopped_at
            stopped_at = trio.current_time()
            ranks.stop(1)

        with pytest.raises(RunnerUnavailable, match="rank group ended: one of its ranks is being"):
            await stream_until_first_token_then(ranks[0], stop_rank_1)
        exited = await wait_exited(ranks, stopped_at)
    assert max(exited) < EXIT_BOUND_S
    assert (ranks[1].stop_step, ranks[1].exit_cause) == ("shutdown", CLEAN)
    assert ranks[0].exit_cause == ranks[2].exit_cause == BROKEN


async def test_stopping_rank_0_alone_ends_its_group_cleanly(
    tmp_path: Path, varied_model: Path
) -> None:
    async with running_group(tmp_path, varied_model, 2) as ranks:
        stopped_at = trio.current_time()
        ranks.stop(0)
        exited = await wait_exited(ranks, stopped_at)
    assert max(exited) < EXIT_BOUND_S
    assert (ranks[0].stop_step, ranks[0].exit_cause) == ("shutdown", CLEAN)
    assert ranks[1].exit_cause == BROKEN


async def test_a_frozen_rank_is_left_by_the_others_after_the_stall_timeout(
    tmp_path: Path, varied_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    config = attrs.evolve(GROUP_CONFIG, group_stall_timeout=STALL_TIMEOUT_S)
    envs = [SLOW_STEPS] * 2
    async with running_group(tmp_path, varied_model, 2, config=config, envs=envs) as ranks:
        victim = ranks[1]
        assert victim.pid is not None
        pid, stopped_at = victim.pid, math.inf

        def freeze() -> None:
            nonlocal stopped_at
            stopped_at = trio.current_time()
            os.kill(pid, signal.SIGSTOP)

        try:
            with pytest.raises(RunnerUnavailable, match="rank group stalled: no word from"):
                await stream_until_first_token_then(ranks[0], freeze)
            exited = await wait_exited(ranks[:1], stopped_at)
        finally:
            os.kill(pid, signal.SIGCONT)
        # Woken, the frozen rank finds its group gone and leaves by itself too.
        await wait_exited([victim], trio.current_time())
    stalled = [r.getMessage() for r in caplog.records if "rank 0: group stalled" in r.getMessage()]
    assert stalled
    # The bound is the stall timeout, stretched on a busy machine (the log line says by how
    # much); the rank leaves once past it.
    bound = float(re.search(r"\(bound ([\d.]+) s\)", stalled[0])[1])  # type: ignore[index]
    assert bound >= STALL_TIMEOUT_S and STALL_TIMEOUT_S <= exited[0] < bound + EXIT_BOUND_S
    assert ranks[0].exit_cause == STALLED
    assert victim.exit_cause is not None
    assert victim.exit_cause.startswith(("exit code 5", "exit code 6"))


async def test_a_group_whose_rank_1_never_comes_fails_to_load_and_rank_0_is_reaped(
    tmp_path: Path, varied_model: Path
) -> None:
    config = attrs.evolve(GROUP_CONFIG, group_init_timeout=INIT_TIMEOUT_S)
    group = loopback_group(2)
    shard = rank_shards(layer_count(varied_model), 2, "pipeline")[0]
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            [rank0] = group_supervisors(tmp_path, 1, config=config)
            await nursery.start(rank0.run)
            # (The bound stretches on a busy machine: the message gives it.)
            expected = (
                r"rank 0 of 2 did not join its group within [\d.]+ s of starting to connect "
                + re.escape(f"(hosts {', '.join(group.hosts)})")
            )
            with pytest.raises(LoadFailed, match=expected):
                await rank0.load(varied_model, shard, group)
            stopping = trio.current_time()
            nursery.cancel_scope.cancel()
    # Stuck in `mx.distributed.init`, which holds the GIL: the ladder's SIGTERM ends it.
    assert trio.current_time() - stopping < config.stop_bound
    assert rank0.stop_step in ("shutdown", "SIGTERM")
    assert isinstance(rank0.status, RunnerStopped)


RANKS_PAST_THE_HEADS = 5
"""More ranks than the model's 4 attention heads: no exact tensor split."""


async def test_a_model_that_cannot_be_split_so_fails_to_load_on_every_rank(
    tmp_path: Path, varied_model: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            ranks = group_supervisors(tmp_path, RANKS_PAST_THE_HEADS)
            for rank in ranks:
                await nursery.start(rank.run)
            ranks_past = RANKS_PAST_THE_HEADS
            shards = rank_shards(layer_count(varied_model), ranks_past, "tensor")
            with pytest.raises(ExceptionGroup) as failures:
                await load_in_rank_order(ranks, varied_model, shards, loopback_group(ranks_past))
            assert failures.group_contains(
                LoadFailed, match="cannot be split by tensor over 5 ranks"
            )
            await wait_exited(ranks, trio.current_time())
            nursery.cancel_scope.cancel()
    assert all(
        r.exit_cause == "exit code 7 (rank failed: could not join its group or load its part)"
        for r in ranks
    )
