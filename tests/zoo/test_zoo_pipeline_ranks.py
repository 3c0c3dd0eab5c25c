"""Zoo models split as a pipeline over real runner processes on loopback (one per rank,
joined by `mx.distributed`'s ring): greedy output token-identical to mlx-lm's whole model
in this process. One representative per kind of split that differs; every architecture
is checked in one process by `test_zoo_pipeline`."""

from __future__ import annotations

from pathlib import Path

import mlx_lm
import pytest

from tests.runner.group_helpers import running_group, tokens_of
from tests.runner.helpers import collect
from trexo.types.generation import ChatMessage, GenerationRequest, SamplingParams
from trexo.types.ids import RequestId

from .models import LONG_QUESTION, ZooModels, greedy
from .test_zoo_pipeline import MAX_TOKENS
from .test_zoo_tensor_ranks import HANG_BOUND_S

SPLIT = (
    pytest.param("gemma3_text", 3, id="gemma3_text-3"),  # sliding-window and global layers
    pytest.param("qwen3_next", 2, id="qwen3_next-2"),  # state-space ArraysCache, hybrid
    pytest.param("deepseek_v3", 2, id="deepseek_v3-2"),  # MLA
    pytest.param("gemma3", 2, id="gemma3-2"),  # blocks in a vision-language wrapper
)


@pytest.mark.parametrize(("arch", "ranks"), SPLIT)
async def test_a_pipeline_of_rank_processes_answers_as_mlx_lm(
    tmp_path: Path, zoo_models: ZooModels, arch: str, ranks: int
) -> None:
    path = zoo_models(arch)
    model, tokenizer = mlx_lm.load(str(path))
    expected = greedy(model, tokenizer, LONG_QUESTION, MAX_TOKENS).tokens
    request = GenerationRequest(
        RequestId("zoo"),
        messages=(ChatMessage("user", LONG_QUESTION),),
        params=SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0),
    )
    async with running_group(tmp_path, path, ranks, hang_bound=HANG_BOUND_S) as group:
        assert tokens_of(await collect(group[0], request)) == expected
