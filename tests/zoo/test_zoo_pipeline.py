"""Every zoo architecture split as a pipeline over 2 and 3 ranks, simulated in one process
(`pipeline_sim`): greedy output token-identical to the whole model's, alone and batched."""

from __future__ import annotations

import re
from typing import Any

import mlx_lm
import pytest
from mlx.utils import tree_flatten
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load_model

from trexo.engine.batch import BatchEngine
from trexo.engine.batch_limits import batch_limit
from trexo.engine.sharding import pipeline_part
from trexo.engine.zoo_archs import ZOO_ARCH_NAMES
from trexo.types.shard import ShardSpec

from . import models
from .models import LONG_QUESTION, QUANTIZED_ARCHS, ZooModels, greedy
from .pipeline_sim import InProcessLinks, Wire, simulated_pipeline

MAX_TOKENS = 64
PREFILL_STEP = 5
"""Prompt tokens per step: several chunks, each after the sliding window's start, so that
masks and caches built from the offsets of other ranks' layers are exercised."""
BLOCK_INDEX = re.compile(r"\.layers\.(\d+)\.")


BATCH_TOKENS = 16
BATCH_PREFILL_STEP = 16
PROMPT_CACHE_BYTES = 1 << 24
FOLLOW_UP = " And why does that matter?"
"""The next turn's text, after each answer: its prompt starts with the first turn's."""


def greedy_tokens(model: Any, tokenizer: Any, prompt: list[int]) -> list[int]:
    """mlx-lm's greedy continuation of `prompt`, alone (up to EOS)."""
    sampler = make_sampler(temp=0.0)
    steps = mlx_lm.stream_generate(
        model, tokenizer, prompt, max_tokens=BATCH_TOKENS, sampler=sampler
    )
    return [step.token for step in steps]


def parameter_names(model: Any) -> list[str]:
    return [name for name, _ in tree_flatten(model.parameters())]


def held_blocks(model: Any) -> set[int]:
    """The indices of the blocks that hold weights."""
    names = parameter_names(model)
    return {int(match[1]) for name in names if (match := BLOCK_INDEX.search(name))}


SPLITS = [
    *(
        pytest.param(arch, ranks, False, id=f"{arch}-{ranks}")
        for arch in ZOO_ARCH_NAMES
        for ranks in (2, 3)
    ),
    *(pytest.param(arch, 2, True, id=f"{arch}-4bit-2") for arch in QUANTIZED_ARCHS),
]
"""Every architecture over 2 and 3 ranks; the 4-bit variants over 2."""


@pytest.mark.parametrize(("arch", "ranks", "quantized"), SPLITS)
def test_a_pipeline_answers_as_the_whole_model(
    zoo_models: ZooModels, arch: str, ranks: int, quantized: bool
) -> None:
    path = zoo_models(arch, quantized=quantized)
    whole, tokenizer = mlx_lm.load(str(path))
    expected = greedy(whole, tokenizer, LONG_QUESTION, MAX_TOKENS, prefill_step=PREFILL_STEP)
    split, ranges = simulated_pipeline(path, ranks)
    for part, (start, end) in zip(split.parts, ranges, strict=True):
        assert held_blocks(part) == set(range(start, end))  # the other blocks hold no weights
    for part in split.parts[:-1]:  # only the last rank holds an untied head
        assert not any(".lm_head." in f".{name}" for name in parameter_names(part))
    answer = greedy(split, tokenizer, LONG_QUESTION, MAX_TOKENS, prefill_step=PREFILL_STEP)
    assert answer.tokens == expected.tokens


def test_a_cut_between_kv_shared_blocks_is_refused_at_load_with_its_reason(
    zoo_models: ZooModels,
) -> None:
    # Placement never proposes it (`pipeline_cuts`); a load asked for it says why not.
    model, config = load_model(zoo_models("gemma4_text"), lazy=True)
    links = InProcessLinks(0, 2, Wire())
    with pytest.raises(ValueError, match="attends with the keys and values of block 2"):
        pipeline_part(model, config, ShardSpec(0, 3, 0, 2), links)


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("arch", ZOO_ARCH_NAMES)
def test_a_pipeline_batches_as_the_whole_model_answers_alone(
    zoo_models: ZooModels, arch: str, ranks: int
) -> None:
    # The runner's batch path (`BatchEngine`: mlx-lm's BatchGenerator, padded prefill,
    # caches merged, filtered and extracted into the prompt cache), then each conversation's
    # next turn, resumed from the cache the first turn left.
    path = zoo_models(arch)
    whole, tokenizer = mlx_lm.load(str(path))
    questions = models.BATCH_QUESTIONS
    first = [models.chat_prompt(tokenizer, question) for question in questions]
    answers = [greedy_tokens(whole, tokenizer, prompt) for prompt in first]
    follow_up = tokenizer.encode(FOLLOW_UP, add_special_tokens=False)
    second = [p + a + follow_up for p, a in zip(first, answers, strict=True)]
    split, _ = simulated_pipeline(path, ranks)
    batch = BatchEngine(
        split,
        tokenizer,
        max_batch=batch_limit(split, len(questions)),
        prefill_step=BATCH_PREFILL_STEP,
        prompt_cache_bytes=PROMPT_CACHE_BYTES,
    )
    for prompts in (first, second):
        by_id = {f"r{k}": prompt for k, prompt in enumerate(prompts)}
        together = models.batched_greedy(
            batch, lambda r, by_id=by_id: by_id[r.request_id], questions, BATCH_TOKENS
        )
        assert together == [greedy_tokens(whole, tokenizer, prompt) for prompt in prompts]
