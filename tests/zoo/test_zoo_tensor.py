"""Every zoo architecture split by tensor, in this process: each rank's part of every block
computes, with the sums over the ranks, what the whole block's part does (`tensor_sim`);
and placement's verdict from `config.json` alone is the load's, for every rank count."""

from __future__ import annotations

import json
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.utils import load_model

from trexo.engine.sharding import _block_holder, shard_model
from trexo.engine.tensor_shares import refusal, shape_of
from trexo.engine.tensor_split import ATTENTION_NAMES, FEED_FORWARD_NAMES
from trexo.engine.zoo_archs import ZOO_ARCH_NAMES
from trexo.types.shard import ShardSpec

from .models import QUANTIZED_ARCHS, ZooModels
from .tensor_sim import simulated_outputs, split_ranks

SEQUENCE = 7
RELATIVE_TOLERANCE = 1e-5
"""float32 sums in another order: ~5e-7 measured; a wrong slice is off by ~1."""


class FakeWorld:
    """Enough of an `mx.distributed.Group` for everything done before a collective."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def call_part(part: Any, x: mx.array) -> mx.array:
    """A block's part on `x`, without a cache (attention: every position sees every other)."""
    try:
        out = part(x, mask=None, cache=None)
    except TypeError:  # a feed-forward part takes only its input
        out = part(x)
    return out[0] if isinstance(out, tuple) else out  # gemma 4 returns its keys and values too


def whole_parts(model: Any) -> list[tuple[int, str, Any]]:
    """Every block's attention and feed-forward parts that stand alone (gemma 4's KV-shared
    layers attend with another block's keys: their block is checked through that one)."""
    parts = []
    for index, block in enumerate(_block_holder(model).layers):
        for name in (*ATTENTION_NAMES, *FEED_FORWARD_NAMES):
            part = block.get(name)
            if part is not None and getattr(part, "has_kv", True):
                parts.append((index, name, part))
    return parts


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("arch", ZOO_ARCH_NAMES)
def test_every_rank_of_a_tensor_split_computes_the_whole_blocks_parts(
    zoo_models: ZooModels, arch: str, ranks: int
) -> None:
    path = zoo_models(arch)
    whole, _ = load_model(path, strict=False)
    split, sums = split_ranks(path, ranks)
    x = mx.random.normal((2, SEQUENCE, whole_width(whole)), key=mx.random.key(ranks))
    checked = 0
    for index, name, part in whole_parts(whole):
        expected = call_part(part, x)
        rank_parts = [
            lambda x, m=model, i=index, n=name: call_part(_block_holder(m).layers[i][n], x)
            for model in split
        ]
        for rank, got in enumerate(simulated_outputs(rank_parts, sums, x)):
            error = float(mx.abs(got - expected).max()) / float(mx.abs(expected).max())
            assert error < RELATIVE_TOLERANCE, f"block {index} {name}, rank {rank}: {error}"
        checked += 1
    assert checked >= 4  # attention or a mixer, and a feed-forward part, in every block


def whole_width(model: Any) -> int:
    embed = _block_holder(model)["embed_tokens"]
    return int(embed.weight.shape[-1])


@pytest.mark.parametrize("ranks", [2, 3, 4, 5])
@pytest.mark.parametrize(
    ("arch", "quantized"),
    [*((a, False) for a in ZOO_ARCH_NAMES), *((a, True) for a in QUANTIZED_ARCHS)],
)
def test_placement_refuses_exactly_the_tensor_splits_that_would_not_load(
    zoo_models: ZooModels, arch: str, quantized: bool, ranks: int
) -> None:
    path = zoo_models(arch, quantized=quantized)
    config = json.loads((path / "config.json").read_text())
    shape = shape_of(config)
    assert shape is not None
    reason = refusal(shape, ranks)
    for rank in range(ranks):
        model, loaded_config = load_model(path, lazy=True, strict=False)
        shard = ShardSpec(None, None, rank, ranks, "tensor")
        if reason is None:
            shard_model(model, loaded_config, shard, FakeWorld(rank, ranks))
        else:
            with pytest.raises(ValueError, match="cannot be split by tensor") as refused:
                shard_model(model, loaded_config, shard, FakeWorld(rank, ranks))
            assert reason in str(refused.value)
