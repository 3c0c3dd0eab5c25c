"""Every zoo architecture split by tensor over real runner processes on loopback (one per
rank, joined by `mx.distributed`'s ring): greedy output token-identical to mlx-lm's whole
model in this process, over 2 ranks and, unevenly, over 3; and four requests batched in a
split instance each as it is alone."""

from __future__ import annotations

import json
from pathlib import Path

import mlx_lm
import pytest
import trio

from tests.runner.group_helpers import running_group, tokens_of
from tests.runner.helpers import collect
from trexo.engine.tensor_shares import refusal, shape_of
from trexo.engine.zoo_archs import ZOO_ARCH_NAMES
from trexo.types.generation import ChatMessage, GenerationRequest, SamplingParams
from trexo.types.ids import RequestId

from .models import BATCH_QUESTIONS, LONG_QUESTION, ZooModels, greedy

MAX_TOKENS = 64
BATCH_TOKENS = 16
HANG_BOUND_S = 300.0
"""Generous: catches hangs only. Three ranks starting, loading and stepping together, with
the suite's other workers beside them, took over a minute at load 20 on 2 cores."""
UNEVEN = (
    "llama",
    "olmo2",
    "phi3",
    "gemma4_text",
    "gpt_oss",
    "granitemoehybrid",
    "lfm2",
    "deepseek_v3",
)
"""Over 3 ranks (4 query heads go 2-1-1, a key-value head on two ranks), one of each kind of
part that splits differently: plain, a norm over every head, fused projections, KV-shared
layers, sinks and experts, a state-space mixer with experts, a convolution mixer, latent
attention. Every
architecture's parts are checked over 3 ranks in one process by `test_zoo_tensor`."""
BATCHED = ("llama", "qwen3_next", "gemma3_text", "gpt_oss")
"""Dense, hybrid state-space with experts, sliding windows, sinks with experts."""


def request(text: str, max_tokens: int, name: str = "zoo") -> GenerationRequest:
    return GenerationRequest(
        RequestId(name),
        messages=(ChatMessage("user", text),),
        params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
    )


def splits_by_tensor(path: Path, ranks: int) -> bool:
    shape = shape_of(json.loads((path / "config.json").read_text()))
    return shape is not None and refusal(shape, ranks) is None


@pytest.mark.parametrize(
    ("arch", "ranks"),
    [
        *(pytest.param(arch, 2, id=f"{arch}-2") for arch in ZOO_ARCH_NAMES),
        *(pytest.param(arch, 3, id=f"{arch}-3") for arch in UNEVEN),
    ],
)
async def test_a_tensor_split_over_rank_processes_answers_as_mlx_lm(
    tmp_path: Path, zoo_models: ZooModels, arch: str, ranks: int
) -> None:
    path = zoo_models(arch)
    if not splits_by_tensor(path, ranks):
        # Placement refuses it up front (`test_zoo_tensor` checks the load refuses it too).
        pytest.skip(f"{arch} cannot be split by tensor over {ranks} ranks")
    model, tokenizer = mlx_lm.load(str(path))
    expected = greedy(model, tokenizer, LONG_QUESTION, MAX_TOKENS).tokens
    async with running_group(tmp_path, path, ranks, "tensor", hang_bound=HANG_BOUND_S) as group:
        assert tokens_of(await collect(group[0], request(LONG_QUESTION, MAX_TOKENS))) == expected


@pytest.mark.parametrize("arch", BATCHED)
async def test_requests_batched_in_a_tensor_split_each_answer_as_alone(
    tmp_path: Path, zoo_models: ZooModels, arch: str
) -> None:
    path = zoo_models(arch)
    model, tokenizer = mlx_lm.load(str(path))
    expected = [greedy(model, tokenizer, q, BATCH_TOKENS).tokens for q in BATCH_QUESTIONS]
    got: dict[int, list[int]] = {}
    async with running_group(tmp_path, path, 3, "tensor", hang_bound=HANG_BOUND_S) as group:

        async def ask(index: int) -> None:
            question = request(BATCH_QUESTIONS[index], BATCH_TOKENS, f"q{index}")
            got[index] = tokens_of(await collect(group[0], question))

        async with trio.open_nursery() as nursery:
            for index in range(len(BATCH_QUESTIONS)):
                nursery.start_soon(ask, index)
    assert [got[i] for i in range(len(BATCH_QUESTIONS))] == expected
