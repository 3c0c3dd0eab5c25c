"""One rank's part of a model, checked in one process (real groups: tests/runner)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import pytest
from mlx.nn.layers.base import Module
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model

from trexo.engine.engine import Engine
from trexo.engine.sharding import PipelineEdge, SkippedBlock, hostfile_entries, shard_model
from trexo.types.generation import ChatMessage, GenerationRequest, SamplingParams
from trexo.types.ids import RequestId
from trexo.types.shard import ShardSpec

N_LAYERS = 4
REQUEST = GenerationRequest(
    RequestId("r"),
    messages=(ChatMessage("user", "What is a lambda?"),),
    params=SamplingParams(max_tokens=24),
)


@attrs.frozen
class FakeWorld:
    """Enough of an `mx.distributed.Group` for the checks made before any collective."""

    rank_: int
    size_: int

    def rank(self) -> int:
        return self.rank_

    def size(self) -> int:
        return self.size_


def lazy(model_dir: Path) -> tuple[Any, dict[str, Any]]:
    return load_model(model_dir, lazy=True)


def tokens(engine: Engine) -> list[int]:
    return [t for chunk in engine.generate(REQUEST, lambda: False) for t in chunk.token_ids]


def test_the_hostfile_lists_one_address_per_rank() -> None:
    assert hostfile_entries(("10.0.0.1:5000", "10.0.0.2:5001")) == [
        ["10.0.0.1:5000"],
        ["10.0.0.2:5001"],
    ]


def parameter_names(model: Any) -> set[str]:
    return {name for name, _ in tree_flatten(model.parameters())}


def edge_names(model: Any) -> set[str]:
    return {name for name in parameter_names(model) if ".layers." not in name}


@pytest.mark.parametrize(
    ("rank", "edges"),
    [
        (0, {"model.embed_tokens.embedding.weight"}),  # the embedding, but not as the head
        (1, set()),
        (2, {"model.embed_tokens.weight", "model.norm.weight"}),  # the tied head and the norm
    ],
)
def test_a_pipeline_rank_holds_only_its_own_edges_when_tied(
    varied_model: Path, rank: int, edges: set[str]
) -> None:
    model, config = lazy(varied_model)
    shard_model(model, config, ShardSpec(rank, rank + 1, rank, 3), FakeWorld(rank, 3))
    assert edge_names(model) == edges


@pytest.mark.parametrize(
    ("rank", "edges"),
    [
        (0, {"model.embed_tokens.weight"}),
        (1, set()),
        (2, {"model.norm.weight", "lm_head.weight"}),
    ],
)
def test_a_pipeline_rank_holds_only_its_own_edges_when_untied(
    untied_model: Path, rank: int, edges: set[str]
) -> None:
    model, config = lazy(untied_model)
    shard_model(model, config, ShardSpec(rank, rank + 1, rank, 3), FakeWorld(rank, 3))
    assert edge_names(model) == edges


def test_stand_ins_give_what_the_model_code_expects_without_weights(varied_model: Path) -> None:
    model, config = lazy(varied_model)
    shard_model(model, config, ShardSpec(1, 2, 1, 3), FakeWorld(1, 3))
    ids = mx.array([[5, 6, 7]])
    hidden = model.model.embed_tokens(ids)
    assert (hidden.shape, hidden.dtype) == ((1, 3, 128), mx.float32)
    # Logits of the last position only, of the vocabulary's width, from the hidden state.
    logits = model.model.embed_tokens.as_linear(hidden)
    assert logits.shape == (1, 1, config["vocab_size"])
    assert not mx.any(logits).item()


def test_pipeline_keeps_its_layers_at_their_global_indices_and_wraps_the_edges(
    varied_model: Path,
) -> None:
    model, config = lazy(varied_model)
    shard_model(model, config, ShardSpec(1, 3, 1, 3), FakeWorld(1, 3))
    layers = model.model.layers
    assert len(layers) == N_LAYERS  # every index as in the whole model
    assert [type(layer) for layer in layers] == [
        SkippedBlock,
        PipelineEdge,
        PipelineEdge,
        SkippedBlock,
    ]
    assert layers[1].use_sliding is False  # the block's own attributes show through
    assert {name.split(".")[2] for name in parameter_names(model) if ".layers." in name} == {
        "1",
        "2",
    }
    assert len(model.make_cache()) == N_LAYERS  # caches too: a skipped block advances its own


@pytest.mark.parametrize(
    ("shard", "world", "message"),
    [
        (ShardSpec(0, 2, 1, 2), FakeWorld(0, 2), "has this process as rank 0 of 2"),
        (ShardSpec(2, 2, 1, 2), FakeWorld(1, 2), r"not \[2, 2\)"),
        (ShardSpec(2, 9, 1, 2), FakeWorld(1, 2), r"within \[0, 4\)"),
        (ShardSpec(None, None, 1, 2), FakeWorld(1, 2), "needs layers"),
        (ShardSpec(0, 2, 0, 2, "tensor"), FakeWorld(0, 2), "holds every layer"),
        (ShardSpec(0, 4, 0, 5, "tensor"), FakeWorld(0, 5), "cannot be split over 5 ranks"),
    ],
)
def test_impossible_shards_are_refused_clearly(
    varied_model: Path, shard: ShardSpec, world: FakeWorld, message: str
) -> None:
    model, config = lazy(varied_model)
    with pytest.raises(ValueError, match=message):
        shard_model(model, config, shard, world)


class Blockless(Module):
    """A model that keeps no list of blocks, and has no `shard`."""


def test_models_without_the_needed_shape_are_refused_clearly() -> None:
    world = FakeWorld(0, 2)
    for sharding in ("pipeline", "tensor"):
        with pytest.raises(ValueError, match="cannot be split across ranks"):
            shard_model(Blockless(), {}, ShardSpec(0, 2, 0, 2, sharding), world)


@pytest.mark.parametrize("model_fixture", ["varied_model", "untied_model"])
def test_a_pipeline_of_one_rank_generates_what_the_whole_model_does(
    request: pytest.FixtureRequest, model_fixture: str
) -> None:
    # A group of one: the sampled token's all_sum runs (and is the identity), nothing is sent.
    model_dir: Path = request.getfixturevalue(model_fixture)
    whole = Engine.load(model_dir)
    split = Engine.load(model_dir, ShardSpec(0, N_LAYERS, 0, 1), world=mx.distributed.init())
    assert isinstance(split.model.model.layers[-1], PipelineEdge)
    expected = tokens(whole)
    assert len(set(expected)) > len(expected) // 2
    assert tokens(split) == expected
