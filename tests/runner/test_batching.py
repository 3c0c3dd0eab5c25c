"""A real runner serving many requests at once: batched together, each as it would be alone."""

from __future__ import annotations

from pathlib import Path

import attrs
import trio

from tests.waiting import NotYet, wait_until
from trexo.runner.hooks import HOOKS_ENV
from trexo.types.chunks import Chunk
from trexo.types.generation import ChatMessage, GenerationRequest, SamplingParams
from trexo.types.ids import RequestId, new_id
from trexo.worker.runner_supervisor import RunnerSupervisor

from .group_helpers import running_group, tokens_of
from .helpers import TEST_TIMEOUT_S, collect, in_process_greedy_tokens, running_supervisor

QUESTIONS = (
    "What does the yield statement do?",
    "Explain the with statement.",
    "How do decorators work?",
    "Tell me about exceptions.",
)
MAX_TOKENS = 24
SLOW_STEPS = {HOOKS_ENV: "step_delay=0.02"}
"""Slow enough that requests sent together surely overlap."""


def chat(*turns: str, max_tokens: int = MAX_TOKENS) -> GenerationRequest:
    messages = tuple(
        ChatMessage("user" if k % 2 == 0 else "assistant", t) for k, t in enumerate(turns)
    )
    return GenerationRequest(
        RequestId(new_id()), messages=messages, params=SamplingParams(max_tokens=max_tokens)
    )


@attrs.define
class Timed:
    chunks: list[Chunk] = attrs.field(factory=list)
    first_at: float = 0.0
    done_at: float = 0.0


async def timed(runner: RunnerSupervisor, request: GenerationRequest, out: Timed) -> None:
    async with runner.open_generation(request) as stream:
        async for chunk in stream:
            if not out.chunks:
                out.first_at = trio.current_time()
            out.chunks.append(chunk)
    out.done_at = trio.current_time()


async def test_requests_at_once_are_served_together_each_as_alone(
    tmp_path: Path, varied_model: Path
) -> None:
    expected = [in_process_greedy_tokens(varied_model, q, MAX_TOKENS) for q in QUESTIONS]
    assert len({tuple(e) for e in expected}) == len(QUESTIONS)
    async with running_supervisor(tmp_path, env=SLOW_STEPS) as runner:
        await runner.load(varied_model)
        results = [Timed() for _ in QUESTIONS]
        async with trio.open_nursery() as nursery:
            for question, out in zip(QUESTIONS, results, strict=True):
                nursery.start_soon(timed, runner, chat(question), out)
    for out, tokens in zip(results, expected, strict=True):
        assert tokens_of(out.chunks) == tokens
    # Batched, not queued: every stream had begun before the first one ended.
    assert max(r.first_at for r in results) < min(r.done_at for r in results)


async def test_a_cancelled_request_leaves_the_others_as_they_were(
    tmp_path: Path, varied_model: Path
) -> None:
    expected = [in_process_greedy_tokens(varied_model, q, MAX_TOKENS) for q in QUESTIONS[:3]]
    async with running_supervisor(tmp_path, env=SLOW_STEPS) as runner:
        await runner.load(varied_model)
        results = [Timed() for _ in range(3)]
        requests = [chat(q) for q in QUESTIONS[:3]]
        async with trio.open_nursery() as nursery:
            for request, out in zip(requests, results, strict=True):
                nursery.start_soon(timed, runner, request, out)
            await wait_until(
                lambda: len(results[1].chunks) >= 5,
                timeout=TEST_TIMEOUT_S,
                what="5 chunks of the request to cancel",
            )
            await runner.cancel(requests[1].request_id)
    assert results[1].chunks[-1].finish_reason == "cancelled"
    assert len(tokens_of(results[1].chunks)) < MAX_TOKENS
    assert tokens_of(results[0].chunks) == expected[0]
    assert tokens_of(results[2].chunks) == expected[2]


async def test_the_next_turn_reads_only_its_new_tokens_and_answers_the_same(
    tmp_path: Path, varied_model: Path
) -> None:
    async with running_supervisor(tmp_path) as runner:
        await runner.load(varied_model)
        first = await collect(runner, chat(QUESTIONS[0]))
        answer = "".join(c.text for c in first)
        second = await collect(runner, chat(QUESTIONS[0], answer, QUESTIONS[1]))
        await wait_until(  # the runner reports its cache after each generation
            lambda: runner.prompt_cache.lookups >= 2 or NotYet(runner.prompt_cache),
            timeout=5,
            what="the second turn's cache report",
        )
        cache = runner.prompt_cache
    # At least the first turn's prompt came from the cache (how much of its answer does too
    # depends on whether its text encodes back to the same tokens: with the demo model's
    # nonsense it need not).
    usage, first_usage = second[-1].usage, first[-1].usage
    assert usage is not None and first_usage is not None
    assert usage.cached_tokens >= first_usage.prompt_tokens > 0
    assert cache.hits == 1 and cache.entries >= 1 and cache.nbytes > 0
    # The same answer as a runner with no cache (a fresh one) gives.
    async with running_supervisor(tmp_path / "fresh") as fresh:
        await fresh.load(varied_model)
        again = await collect(fresh, chat(QUESTIONS[0], answer, QUESTIONS[1]))
    assert tokens_of(second) == tokens_of(again)
    assert again[-1].usage is not None and again[-1].usage.cached_tokens == 0


async def test_a_split_model_batches_its_requests_in_lockstep(
    tmp_path: Path, varied_model: Path
) -> None:
    expected = [in_process_greedy_tokens(varied_model, q, MAX_TOKENS) for q in QUESTIONS[:3]]
    async with running_group(tmp_path, varied_model, 2) as ranks:
        results = [Timed() for _ in range(3)]
        async with trio.open_nursery() as nursery:
            for question, out in zip(QUESTIONS[:3], results, strict=True):
                nursery.start_soon(timed, ranks[0], chat(question), out)
    for out, tokens in zip(results, expected, strict=True):
        assert tokens_of(out.chunks) == tokens
    assert max(r.first_at for r in results) < min(r.done_at for r in results)
