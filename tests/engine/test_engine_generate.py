from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.generate import stream_generate
from mlx_lm.sample_utils import make_sampler

from trexo.engine.engine import Engine
from trexo.types.chunks import Chunk
from trexo.types.generation import ChatMessage, GenerationRequest, SamplingParams
from trexo.types.ids import RequestId
from trexo.types.shard import ShardSpec

RID = RequestId("req-1")
MESSAGES = (ChatMessage("user", "What is a generator expression?"),)
N_TOKENS = 24


def request(**params: object) -> GenerationRequest:
    return GenerationRequest(RID, messages=MESSAGES, params=SamplingParams(**params))  # type: ignore[arg-type]


def never() -> bool:
    return False


def run(engine: Engine, req: GenerationRequest) -> list[Chunk]:
    chunks = list(engine.generate(req, never))
    check_shape(chunks)
    return chunks


def check_shape(chunks: list[Chunk]) -> None:
    """Only the last chunk is final; usage counts exactly the token ids delivered."""
    assert all(c.finish_reason is None and c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.finish_reason is not None
    assert last.usage is not None
    assert last.usage.completion_tokens == len(tokens_of(chunks))
    assert all(c.request_id == RID for c in chunks)


def tokens_of(chunks: Iterable[Chunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def text_of(chunks: Iterable[Chunk]) -> str:
    return "".join(c.text for c in chunks)


def templated_prompt(engine: Engine) -> list[int]:
    messages = [{"role": m.role, "content": m.content} for m in MESSAGES]
    return list(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True))


@pytest.fixture(scope="module")
def greedy(engine: Engine) -> list[Chunk]:
    return run(engine, request(max_tokens=N_TOKENS))


def test_greedy_matches_mlx_lm_stream_generate(engine: Engine, greedy: list[Chunk]) -> None:
    reference = list(
        stream_generate(
            engine.model,
            engine.tokenizer,
            mx.array(templated_prompt(engine)),
            max_tokens=N_TOKENS,
            sampler=make_sampler(temp=0.0),
        )
    )
    assert tokens_of(greedy) == [r.token for r in reference]
    assert text_of(greedy) == "".join(r.text for r in reference)
    assert greedy[-1].finish_reason == reference[-1].finish_reason


def test_max_tokens_ends_with_length(greedy: list[Chunk]) -> None:
    # The tiny model does not emit EOS within these tokens, so it runs to the limit.
    assert greedy[-1].finish_reason == "length"
    assert greedy[-1].usage is not None
    assert greedy[-1].usage.completion_tokens == N_TOKENS
    assert len(greedy) == N_TOKENS  # one chunk per token


def test_short_max_tokens_is_a_prefix(engine: Engine, greedy: list[Chunk]) -> None:
    chunks = run(engine, request(max_tokens=5))
    assert chunks[-1].finish_reason == "length"
    assert tokens_of(chunks) == tokens_of(greedy)[:5]


def test_prompt_tokens_count_the_templated_prompt(engine: Engine, greedy: list[Chunk]) -> None:
    assert greedy[-1].usage is not None
    assert greedy[-1].usage.prompt_tokens == len(templated_prompt(engine))
    assert engine.encode_prompt(request()) == templated_prompt(engine)


def test_raw_prompt_is_encoded_as_is(engine: Engine) -> None:
    text = "<|im_start|>user\nWhat is a generator expression?"
    req = GenerationRequest(RID, prompt=text, params=SamplingParams(max_tokens=3))
    chunks = run(engine, req)
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == len(engine.tokenizer.encode(text))


def test_stop_sequence_cuts_text(engine: Engine, greedy: list[Chunk]) -> None:
    full = text_of(greedy)
    middle = len(full) // 2
    stop = full[middle : middle + 3]
    expected = full[: full.index(stop)]
    chunks = run(engine, request(max_tokens=N_TOKENS, stop=(stop,)))
    assert text_of(chunks) == expected
    assert chunks[-1].finish_reason == "stop"
    assert not any(stop in c.text for c in chunks)
    assert tokens_of(chunks) == tokens_of(greedy)[: len(tokens_of(chunks))]
    assert len(tokens_of(chunks)) < N_TOKENS


def test_eos_ends_with_stop_and_is_counted(
    engine: Engine, greedy: list[Chunk], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Random weights rarely pick the real EOS, so declare a token the model does produce one.
    tokens = tokens_of(greedy)
    eos = tokens[6]
    first = tokens.index(eos)
    monkeypatch.setattr(engine.tokenizer, "eos_token_ids", {*engine.tokenizer.eos_token_ids, eos})
    chunks = run(engine, request(max_tokens=N_TOKENS))
    assert chunks[-1].finish_reason == "stop"
    assert tokens_of(chunks) == tokens[: first + 1]  # the EOS is delivered and counted
    assert chunks[-1].token_ids == (eos,)
    assert text_of(chunks) == engine.tokenizer.decode(tokens[:first])


def test_should_stop_cancels_within_one_step(engine: Engine) -> None:
    received: list[Chunk] = []
    stop_after = 3

    def should_stop() -> bool:
        return len(received) >= stop_after

    for chunk in engine.generate(request(max_tokens=N_TOKENS), should_stop):
        received.append(chunk)
    check_shape(received)
    assert received[-1].finish_reason == "cancelled"
    assert received[-1].usage is not None
    assert received[-1].usage.completion_tokens == stop_after


def test_should_stop_before_start_generates_nothing(engine: Engine) -> None:
    chunks = list(engine.generate(request(), lambda: True))
    assert len(chunks) == 1
    assert chunks[0].finish_reason == "cancelled"
    assert chunks[0].usage is not None
    assert chunks[0].usage.completion_tokens == 0


def test_seeded_sampling_is_reproducible(engine: Engine) -> None:
    def sample(seed: int) -> list[int]:
        return tokens_of(run(engine, request(max_tokens=16, temperature=1.0, seed=seed)))

    first = sample(7)
    run(engine, request(max_tokens=4, temperature=1.0))  # unseeded use in between
    assert sample(7) == first
    assert sample(8) != first


def test_sampling_knobs_are_accepted(engine: Engine) -> None:
    params = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "seed": 1}
    chunks = run(engine, request(max_tokens=6, repetition_penalty=1.3, **params))
    assert chunks[-1].finish_reason == "length"


def test_invalid_max_tokens_is_refused_at_call(engine: Engine) -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        engine.generate(request(max_tokens=0), never)


def test_non_whole_shard_is_refused(tiny_model: Path) -> None:
    with pytest.raises(ValueError, match="whole"):
        Engine.load(tiny_model, ShardSpec(start_layer=0, end_layer=2, rank=0, world_size=2))


def test_missing_model_is_not_fetched_from_the_hub(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Engine.load(tmp_path / "nope")


def test_load_reports_progress(tiny_model: Path) -> None:
    seen: list[float] = []
    Engine.load(tiny_model, on_progress=seen.append)
    assert seen[0] == 0.0
    assert seen[-1] == 1.0
    assert seen == sorted(seen)
