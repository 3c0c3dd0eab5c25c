"""Where a pipeline may cut a model, from its `config.json` alone."""

from __future__ import annotations

import pytest

from trexo.catalog import layout_of
from trexo.engine.pipeline_cuts import (
    allowed_cuts,
    fit_shares,
    kv_sources,
    layer_range_refusal,
    limited_cuts,
)

LLAMA = {"model_type": "llama", "num_hidden_layers": 6}
GEMMA4 = {
    "model_type": "gemma4_text",
    "num_hidden_layers": 6,
    "sliding_window_pattern": 3,
    "num_kv_shared_layers": 2,
}
"""The zoo's gemma 4: kinds s s f s s f; blocks 4 and 5 read blocks 3 and 2."""


def test_most_architectures_may_be_cut_before_any_block() -> None:
    assert kv_sources(LLAMA) == [0, 1, 2, 3, 4, 5]
    assert allowed_cuts(LLAMA) == [1, 2, 3, 4, 5]
    assert limited_cuts(LLAMA) is None
    assert layer_range_refusal(LLAMA, 2, 5) is None


def test_kv_shared_blocks_stay_with_the_blocks_they_read() -> None:
    assert kv_sources(GEMMA4) == [0, 1, 2, 3, 3, 2]
    assert allowed_cuts(GEMMA4) == [1, 2]
    reason = layer_range_refusal(GEMMA4, 0, 3)
    assert reason is not None and "block 5 attends with the keys and values of block 2" in reason
    assert layer_range_refusal(GEMMA4, 2, 6) is None


def test_a_vision_language_config_is_read_from_its_text_config() -> None:
    wrapper = {"model_type": "gemma4", "text_config": GEMMA4}
    assert allowed_cuts(wrapper) == [1, 2]


@pytest.mark.parametrize(
    ("config", "sources"),
    [
        # mlx-lm's defaults: 20 shared blocks, a pattern of 5 (4 sliding, 1 full).
        ({"model_type": "gemma4_text", "num_hidden_layers": 25}, [*range(5), *[3, 3, 3, 3, 4] * 4]),
        ({**GEMMA4, "num_kv_shared_layers": 0}, list(range(6))),
        (
            {**GEMMA4, "layer_types": ["full_attention", "sliding_attention"] * 3},
            [0, 1, 2, 3, 2, 3],
        ),
    ],
)
def test_kv_sources_follow_mlx_lms_defaults_and_layer_types(
    config: dict[str, object], sources: list[int]
) -> None:
    assert kv_sources(config) == sources


@pytest.mark.parametrize(
    ("shares", "allowed", "fitted"),
    [
        ((3, 3), [1, 2, 3, 4, 5], (3, 3)),
        ((3, 3), [1, 2], (2, 4)),
        ((2, 2, 2), [1, 2], (1, 1, 4)),
        ((1, 5), [4], (4, 2)),
        ((2, 2, 2), [3], None),  # two cuts needed, one allowed
    ],
)
def test_shares_move_to_the_nearest_allowed_cuts(
    shares: tuple[int, ...], allowed: list[int], fitted: tuple[int, ...] | None
) -> None:
    assert fit_shares(shares, allowed) == fitted


def test_placement_reads_the_limit_with_the_layout() -> None:
    layout = layout_of({**GEMMA4, "num_attention_heads": 4, "intermediate_size": 64})
    assert layout is not None
    assert layout.pipeline_cuts == (1, 2)
    assert "KV-shared" in layout.cuts_limited_because
    plain = layout_of({**LLAMA, "num_attention_heads": 4, "intermediate_size": 64})
    assert plain is not None and plain.pipeline_cuts is None
