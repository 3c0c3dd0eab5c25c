"""Which part of a model a runner holds, and how the ranks of a split model find each other."""

from __future__ import annotations

from typing import Literal

import attrs

Sharding = Literal["pipeline", "tensor"]
"""pipeline: each rank holds a contiguous range of layers and passes the hidden state on;
tensor: every rank holds every layer, each weight matrix split across the ranks."""


@attrs.frozen
class ShardSpec:
    """Layers `[start_layer, end_layer)` of a model, as rank `rank` of `world_size`.

    `None` for the layer bounds means the whole model (a single-runner instance). A tensor
    shard holds every layer (`start_layer` 0, `end_layer` the model's layer count).
    """

    start_layer: int | None = None
    end_layer: int | None = None
    rank: int = 0
    world_size: int = 1
    sharding: Sharding = "pipeline"

    @property
    def is_whole(self) -> bool:
        return self.world_size == 1 and self.start_layer is None and self.end_layer is None

    @property
    def layer_count(self) -> int | None:
        """Layers this rank computes; None for a whole model."""
        if self.start_layer is None or self.end_layer is None:
            return None
        return self.end_layer - self.start_layer


@attrs.frozen
class RankGroup:
    """How the ranks of one split instance reach each other, for one bring-up (`epoch`).

    `hosts[r]` is rank r's `"ip:port"`: the address rank r's node is reached on by its
    peers, and a port that node chose for this epoch. A rebuilt group gets a new epoch and
    new ports.
    """

    epoch: int
    hosts: tuple[str, ...]
