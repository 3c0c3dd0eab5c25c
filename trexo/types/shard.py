"""Which part of a model a runner holds."""

from __future__ import annotations

import attrs


@attrs.frozen
class ShardSpec:
    """Layers `[start_layer, end_layer)` of a model with `n_layers`, as rank `rank` of `world_size`.

    `None` for the layer bounds means the whole model (a single-runner instance).
    """

    start_layer: int | None = None
    end_layer: int | None = None
    rank: int = 0
    world_size: int = 1

    @property
    def is_whole(self) -> bool:
        return self.world_size == 1 and self.start_layer is None and self.end_layer is None
