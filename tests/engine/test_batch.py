"""Continuous batching in one process: many requests stepped together answer as each alone."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from trexo.engine.batch import BatchEngine
from trexo.engine.engine import Engine
from trexo.types.chunks import Chunk
from trexo.types.generation import ChatMessage, GenerationRequest, SamplingParams
from trexo.types.ids import RequestId

QUESTIONS = (
    "What is a generator expression?",
    "Explain the with statement.",
    "How do decorators work?",
    "What does yield from do?",
    "Tell me about exceptions.",
)
N_TOKENS = 24
CACHE_BYTES = 64 * 1024 * 1024


@pytest.fixture(scope="module")
def varied(varied_model: Path) -> Engine:
    """The demo model whose next token depends on the whole context."""
    engine = Engine.load(varied_model, prefill_step=16)
    engine.warmup()
    return engine


def chat(rid: str, *messages: str, **params: object) -> GenerationRequest:
    turns = tuple(
        ChatMessage("user" if k % 2 == 0 else "assistant", text) for k, text in enumerate(messages)
    )
    defaults: dict[str, object] = {"max_tokens": N_TOKENS}
    return GenerationRequest(
        RequestId(rid),
        messages=turns,
        params=SamplingParams(**(defaults | params)),  # type: ignore[arg-type]
    )


def alone(engine: Engine, request: GenerationRequest) -> list[Chunk]:
    return list(engine.generate(request, lambda: False))


def tokens_of(chunks: Iterable[Chunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def run_together(
    engine: Engine, batch: BatchEngine, requests: list[GenerationRequest]
) -> dict[RequestId, list[Chunk]]:
    """Every request added at once, stepped until all are done: each one's chunks."""
    out: dict[RequestId, list[Chunk]] = {r.request_id: [] for r in requests}
    for request in requests:
        batch.add(*engine.admit(request))
    while batch:
        for chunk in batch.step():
            out[chunk.request_id].append(chunk)
    return out


def test_requests_batched_together_answer_token_for_token_as_each_alone(varied: Engine) -> None:
    requests = [chat(f"r{k}", q) for k, q in enumerate(QUESTIONS)]
    expected = {r.request_id: alone(varied, r) for r in requests}
    assert len({tuple(tokens_of(c)) for c in expected.values()}) == len(requests)
    together = run_together(varied, varied.batch(max_batch=8), requests)
    for rid, chunks in together.items():
        assert tokens_of(chunks) == tokens_of(expected[rid])
        assert "".join(c.text for c in chunks) == "".join(c.text for c in expected[rid])
        assert chunks[-1].finish_reason == "length" and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == N_TOKENS


def test_a_request_that_leaves_midway_changes_nothing_for_the_others(varied: Engine) -> None:
    requests = [chat(f"r{k}", q) for k, q in enumerate(QUESTIONS[:3])]
    expected = {r.request_id: tokens_of(alone(varied, r)) for r in requests}
    batch = varied.batch(max_batch=8)
    for request in requests:
        batch.add(*varied.admit(request))
    got: dict[RequestId, list[Chunk]] = {r.request_id: [] for r in requests}
    steps = 0
    while batch:
        steps += 1
        if steps == 6:
            final = batch.remove(RequestId("r1"))
            assert final is not None and final.finish_reason == "cancelled"
            got[final.request_id].append(final)
        for chunk in batch.step():
            got[chunk.request_id].append(chunk)
    cancelled = tokens_of(got[RequestId("r1")])
    assert 0 < len(cancelled) < N_TOKENS
    assert cancelled == expected[RequestId("r1")][: len(cancelled)]
    for rid in (RequestId("r0"), RequestId("r2")):
        assert tokens_of(got[rid]) == expected[rid]


def test_a_seeded_request_samples_the_same_tokens_alone_or_in_a_batch(varied: Engine) -> None:
    sampled = chat("s", QUESTIONS[0], temperature=0.9, seed=1234)
    others = [chat(f"o{k}", q, temperature=0.9) for k, q in enumerate(QUESTIONS[1:])]
    expected = tokens_of(alone(varied, sampled))
    together = run_together(varied, varied.batch(max_batch=8), [*others, sampled])
    assert tokens_of(together[RequestId("s")]) == expected
    other_seed = tokens_of(alone(varied, chat("s", QUESTIONS[0], temperature=0.9, seed=99)))
    assert other_seed != expected


def test_a_stop_string_ends_one_request_and_not_the_others(varied: Engine) -> None:
    plain = chat("plain", QUESTIONS[0])
    text = "".join(c.text for c in alone(varied, plain))
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    stopped = chat("stopped", QUESTIONS[0], stop=(stop,))
    other = chat("other", QUESTIONS[1])
    together = run_together(varied, varied.batch(max_batch=8), [stopped, other])
    stopped_text = "".join(c.text for c in together[RequestId("stopped")])
    assert together[RequestId("stopped")][-1].finish_reason == "stop"
    assert stopped_text == text[: text.index(stop)]
    assert tokens_of(together[RequestId("other")]) == tokens_of(alone(varied, other))


def test_a_long_prompt_is_read_a_chunk_per_step_while_the_others_stream(varied: Engine) -> None:
    running = chat("running", QUESTIONS[0], max_tokens=60)
    long_prompt = chat("long", " ".join(QUESTIONS * 12))  # ~500 tokens: many 16-token chunks
    batch = varied.batch(max_batch=8)
    batch.add(*varied.admit(running))
    while not batch.step():  # until it streams
        pass
    prompt_tokens = len(varied.admit(long_prompt)[1])
    batch.add(*varied.admit(long_prompt))
    steps_before_first = 0
    while True:
        chunks = batch.step()
        ids = {c.request_id for c in chunks}
        assert RequestId("running") in ids  # one token for the running stream, every step
        if RequestId("long") in ids:
            break
        steps_before_first += 1
    assert steps_before_first >= prompt_tokens // 16 - 1


def test_the_next_turn_reuses_the_cached_history_and_answers_the_same(varied: Engine) -> None:
    first = chat("t1", QUESTIONS[0])
    answer = "".join(c.text for c in alone(varied, first))
    second = chat("t2", QUESTIONS[0], answer, QUESTIONS[1])
    without_cache = alone(varied, second)
    batch = varied.batch(prompt_cache_bytes=CACHE_BYTES)
    run_together(varied, batch, [first])
    stats = batch.cache_stats()
    assert stats.entries == 1 and 0 < stats.nbytes <= CACHE_BYTES
    with_cache = run_together(varied, batch, [second])[RequestId("t2")]
    assert tokens_of(with_cache) == tokens_of(without_cache)
    usage = with_cache[-1].usage
    assert usage is not None and usage.prompt_tokens == len(varied.admit(second)[1])
    # The first turn's prompt and answer were not read again.
    assert usage.cached_tokens >= len(varied.admit(first)[1])
    assert batch.cache_stats().hits == 1


def test_the_cache_stays_within_its_bytes(varied: Engine) -> None:
    small = 64 * 1024
    batch = varied.batch(prompt_cache_bytes=small)
    run_together(varied, batch, [chat(f"r{k}", q) for k, q in enumerate(QUESTIONS)])
    assert batch.cache_stats().nbytes <= small
