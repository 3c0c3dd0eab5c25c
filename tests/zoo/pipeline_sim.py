"""A pipeline simulated in one process: each rank's part cut by the code `shard_model` runs
(`trexo.engine.sharding.pipeline_part`), the hidden state handed from rank to rank in
memory instead of over the ring, and one model that steps every part in rank order, so that
mlx-lm's own generation loops run it as they run the whole model."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from trexo.engine.pipeline_cuts import allowed_cuts, fit_shares
from trexo.engine.sharding import pipeline_part
from trexo.master.placement import split_layers
from trexo.types.shard import ShardSpec


class Wire:
    """The hidden states sent in one step, by sending rank."""

    def __init__(self) -> None:
        self.sent: dict[int, mx.array] = {}


class InProcessLinks:
    """`trexo.engine.sharding.Links` between ranks stepped in turn in this process."""

    def __init__(self, rank: int, size: int, wire: Wire) -> None:
        self.rank = rank
        self.size = size
        self._wire = wire

    def receive(self, like: mx.array) -> mx.array:
        sent = self._wire.sent[self.rank - 1]
        assert (sent.shape, sent.dtype) == (like.shape, like.dtype)
        return sent

    def send(self, hidden: mx.array) -> mx.array:
        self._wire.sent[self.rank] = hidden
        return hidden

    def last_ranks(self, hidden: mx.array) -> mx.array:
        # Only the last rank's output is the simulated model's; the others' are dropped.
        return hidden


class SimulatedPipeline(nn.Module):
    """Every rank's part, stepped in rank order; the last rank's logits are the output.
    Its cache is every part's, one after the other."""

    def __init__(self, parts: Sequence[Any]) -> None:
        super().__init__()
        self.parts = list(parts)
        self.model_type = getattr(parts[0], "model_type", None)  # `batch_limits` reads it
        self._cache_lengths = [len(make_prompt_cache(part)) for part in parts]

    def make_cache(self) -> list[Any]:
        return [cache for part in self.parts for cache in make_prompt_cache(part)]

    def __call__(self, inputs: mx.array, cache: Any = None, **kwargs: Any) -> mx.array:
        out: mx.array | None = None
        begin = 0
        for part, length in zip(self.parts, self._cache_lengths, strict=True):
            own = None if cache is None else cache[begin : begin + length]
            out = part(inputs, cache=own, **kwargs)
            begin += length
        assert out is not None
        return out


def layer_ranges(config: dict[str, Any], n_layers: int, ranks: int) -> list[tuple[int, int]]:
    """Even shares of the blocks, each cut moved to the nearest cut the model allows."""
    shares = fit_shares(split_layers(n_layers, [1] * ranks), allowed_cuts(config))
    assert shares is not None, f"no pipeline over {ranks} ranks"
    bounds = [sum(shares[:rank]) for rank in range(ranks + 1)]
    return list(itertools.pairwise(bounds))


def simulated_pipeline(
    model_dir: Path, ranks: int
) -> tuple[SimulatedPipeline, list[tuple[int, int]]]:
    """The model in `model_dir` split over `ranks` simulated ranks, and each one's blocks."""
    wire = Wire()
    parts = []
    ranges: list[tuple[int, int]] = []
    for rank in range(ranks):
        model, config = load_model(model_dir, lazy=True, strict=False)
        if not ranges:
            text = config.get("text_config") or config
            ranges = layer_ranges(config, int(text["num_hidden_layers"]), ranks)
        start, end = ranges[rank]
        pipeline_part(
            model, config, ShardSpec(start, end, rank, ranks), InProcessLinks(rank, ranks, wire)
        )
        mx.eval(model.parameters())
        parts.append(model)
    return SimulatedPipeline(parts), ranges
