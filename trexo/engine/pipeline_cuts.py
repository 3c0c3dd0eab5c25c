"""Where a model can be cut into pipeline stages, read from its `config.json` alone.

A pipeline rank keeps every other rank's blocks as weightless stand-ins at their global
indices (`trexo.engine.sharding.pipeline_part`), so masks, caches and layer patterns are
chosen as in the whole model, and any cut between two blocks is exact, with one exception:
blocks that read state another block computed within the same step. gemma 4's KV-shared
layers (the last `num_kv_shared_layers` blocks) attend with the keys and values of the last
earlier non-shared block of their kind; those never leave the rank that computed them, so a
cut may not fall between a shared block and the block it reads.

Placement (`trexo.master.placement`) asks before it proposes a layout; the load refuses
what placement should never have proposed.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

GEMMA4_DEFAULT_KV_SHARED_LAYERS = 20
GEMMA4_DEFAULT_SLIDING_WINDOW_PATTERN = 5
"""mlx-lm's `gemma4_text.ModelArgs` defaults, for configs that leave the fields out."""
KV_SHARING_MODEL_TYPES = frozenset({"gemma4", "gemma4_text"})


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The text decoder's fields: a vision-language config's `text_config`, else itself."""
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


def kv_sources(config: Mapping[str, Any]) -> list[int]:
    """For each block, the block whose keys and values it attends with (itself, unless the
    architecture shares them across blocks)."""
    text = text_config(config)
    n_layers = int(text.get("num_hidden_layers", 0))
    sources = list(range(n_layers))
    model_type = text.get("model_type", config.get("model_type"))
    if model_type not in KV_SHARING_MODEL_TYPES:
        return sources
    shared = int(text.get("num_kv_shared_layers", GEMMA4_DEFAULT_KV_SHARED_LAYERS) or 0)
    if shared <= 0:
        return sources
    kinds = _gemma4_layer_types(text, n_layers)
    last_of_kind: dict[str, int] = {}
    for layer in range(n_layers - shared):
        last_of_kind[kinds[layer]] = layer
    for layer in range(max(n_layers - shared, 0), n_layers):
        sources[layer] = last_of_kind.get(kinds[layer], layer)
    return sources


def _gemma4_layer_types(text: Mapping[str, Any], n_layers: int) -> Sequence[str]:
    kinds = text.get("layer_types")
    if isinstance(kinds, list) and len(kinds) >= n_layers:
        return [str(kind) for kind in kinds]
    pattern_length = int(text.get("sliding_window_pattern", GEMMA4_DEFAULT_SLIDING_WINDOW_PATTERN))
    pattern = ["sliding_attention"] * (pattern_length - 1) + ["full_attention"]
    return (pattern * (n_layers // len(pattern) + 1))[:n_layers]


def cut_refusal(config: Mapping[str, Any], cut: int) -> str | None:
    """Why the model cannot be cut before block `cut` (blocks `[0, cut)` on one rank,
    `[cut, n)` on later ones), or None if it can."""
    for layer, source in enumerate(kv_sources(config)):
        if source < cut <= layer:
            return (
                f"block {layer} attends with the keys and values of block {source} "
                f"(KV sharing), which would be on an earlier rank: "
                f"a pipeline cannot cut before block {cut}"
            )
    return None


def layer_range_refusal(config: Mapping[str, Any], start: int, end: int) -> str | None:
    """Why a rank cannot hold blocks `[start, end)`, or None if it can."""
    n_layers = len(kv_sources(config))
    for cut in (start, end):
        if 0 < cut < n_layers and (reason := cut_refusal(config, cut)):
            return reason
    return None


def allowed_cuts(config: Mapping[str, Any]) -> list[int]:
    """The blocks before which a pipeline may cut, in order."""
    n_layers = len(kv_sources(config))
    return [cut for cut in range(1, n_layers) if cut_refusal(config, cut) is None]


def limited_cuts(config: Mapping[str, Any]) -> tuple[tuple[int, ...], str] | None:
    """The cuts a pipeline may make and why only those, where the model limits them (what
    placement keeps in a `ModelLayout`); None if it may cut before any block."""
    n_layers = len(kv_sources(config))
    allowed = allowed_cuts(config)
    if len(allowed) == max(n_layers - 1, 0):
        return None
    return tuple(allowed), (
        "its KV-shared blocks attend with the keys and values of earlier blocks, "
        "which must be on the same node"
    )


def fit_shares(shares: Sequence[int], allowed: Sequence[int]) -> tuple[int, ...] | None:
    """`shares` (blocks per rank, in rank order) with each cut between two ranks moved to
    the nearest of the `allowed` cuts (ascending; ties to the earlier), every rank keeping
    a block; None if there are too few allowed cuts for that many ranks."""
    wanted = [sum(shares[: rank + 1]) for rank in range(len(shares) - 1)]
    cuts: list[int] = []
    for index, target in enumerate(wanted):
        later = len(wanted) - index - 1  # cuts still to place after this one
        previous = cuts[-1] if cuts else 0
        candidates = [
            cut
            for position, cut in enumerate(allowed)
            if cut > previous and len(allowed) - position - 1 >= later
        ]
        if not candidates:
            return None
        cuts.append(min(candidates, key=lambda cut: (abs(cut - target), cut)))
    bounds = [0, *cuts, sum(shares)]
    return tuple(end - start for start, end in itertools.pairwise(bounds))
