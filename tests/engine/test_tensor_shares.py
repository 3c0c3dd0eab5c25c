"""The arithmetic of tensor splits: every head and every column on exactly one rank (key-value
heads where their query heads are), grouped attention intact on every rank, and a verdict
from `config.json` that names what cannot be split."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trexo.engine.tensor_shares import (
    even_shares,
    head_block,
    head_shares,
    largest_share,
    refusal,
    shape_of,
    width_shares,
)
from trexo.types.models import TensorShape


@given(st.integers(0, 500), st.integers(1, 40))
def test_even_shares_are_as_even_as_can_be(count: int, ranks: int) -> None:
    shares = even_shares(count, ranks)
    if count < ranks:
        assert shares is None
        return
    assert shares is not None and len(shares) == ranks and sum(shares) == count
    assert max(shares) - min(shares) <= 1 and min(shares) >= 1
    assert shares == sorted(shares, reverse=True)  # earlier ranks take the remainder


@given(
    n_kv=st.integers(1, 8),
    group=st.integers(1, 8),
    ranks=st.integers(1, 12),
    block=st.sampled_from([1, 2, 4]),
)
def test_head_shares_give_every_query_head_to_one_rank_with_the_kv_heads_it_reads(
    n_kv: int, group: int, ranks: int, block: int
) -> None:
    n_heads = n_kv * group
    shares = head_shares(n_heads, n_kv, ranks, block)
    if block == 1:  # without quantization, any rank count up to the query heads splits
        assert (shares is None) == (ranks > n_heads)
    if shares is None:
        return
    assert len(shares) == ranks
    # Query heads: contiguous, in rank order, each on exactly one rank, in whole blocks.
    assert [s.queries[0] for s in shares] == [0, *(s.queries[1] for s in shares[:-1])]
    assert shares[-1].queries[1] == n_heads
    assert all(
        (s.queries[1] - s.queries[0]) % block == 0 and s.queries[1] > s.queries[0] for s in shares
    )
    owned = []
    for share in shares:
        (q0, q1), (k0, k1) = share.queries, share.kv
        # The key-value heads a rank holds are exactly those its query heads read...
        assert (k0, k1) == (q0 // group, (q1 - 1) // group + 1)
        # ...and grouped attention on the rank maps each query head to its own.
        local_q, local_kv = q1 - q0, k1 - k0
        assert local_q % local_kv == 0
        assert all(k0 + i // (local_q // local_kv) == (q0 + i) // group for i in range(local_q))
        owned += list(range(*share.owned_kv))
    assert owned == list(range(n_kv))  # a norm over every key-value head counts each once


def test_three_ranks_split_four_heads_of_two_groups_exactly() -> None:
    shares = head_shares(4, 2, 3)
    assert shares is not None
    assert [(s.queries, s.kv, s.owned_kv) for s in shares] == [
        ((0, 1), (0, 1), (0, 1)),
        ((1, 2), (0, 1), (1, 1)),  # key-value head 0 again, owned by rank 0
        ((2, 4), (1, 2), (1, 2)),
    ]


def test_widths_split_in_whole_quantization_groups() -> None:
    assert width_shares(128, 3) == [(0, 43), (43, 86), (86, 128)]
    assert width_shares(256, 3, 64) == [(0, 128), (128, 192), (192, 256)]
    assert width_shares(128, 3, 64) is None  # two groups over three ranks
    assert width_shares(100, 2, 64) is None
    assert head_block(128, 64) == 1 and head_block(16, 64) == 4 and head_block(64, 0) == 1


LLAMA_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
}


@pytest.mark.parametrize(
    ("config", "ranks", "why"),
    [
        (LLAMA_8B, 3, None),  # whole key-value groups: 12-12-8 query heads
        (LLAMA_8B, 32, None),
        (LLAMA_8B, 33, "its 32 attention heads (8 key-value) cannot be split over 33 ranks"),
        ({**LLAMA_8B, "quantization": {"group_size": 64, "bits": 4}}, 5, None),
        (
            {**LLAMA_8B, "head_dim": 16, "quantization": {"group_size": 64, "bits": 4}},
            16,
            "cannot be split over 16 ranks in blocks of 4 (quantized in groups of 64)",
        ),
        # latent attention: one latent key-value for every head, on every rank
        ({**LLAMA_8B, "model_type": "deepseek_v3", "num_key_value_heads": 32}, 3, None),
        ({**LLAMA_8B, "model_type": "deepseek_v3", "num_key_value_heads": 32}, 4, None),
        (
            {"text_config": {**LLAMA_8B, "moe_intermediate_size": 2}},
            3,
            "its feed-forward width 2 cannot be split over 3 ranks",
        ),
    ],
)
def test_the_verdict_from_a_config_names_what_cannot_be_split(
    config: dict[str, object], ranks: int, why: str | None
) -> None:
    shape = shape_of(config)
    assert shape is not None
    reason = refusal(shape, ranks)
    if why is None:
        assert reason is None
    else:
        assert reason is not None and why in reason


def test_latent_attention_splits_its_query_heads_around_one_shared_latent() -> None:
    config = {**LLAMA_8B, "model_type": "deepseek_v3", "num_key_value_heads": 32}
    shape = shape_of({**config, "v_head_dim": 128, "quantization": {"group_size": 64}})
    assert shape is not None and shape.latent_attention and shape.head_dim == 128
    assert refusal(shape, 5) is None  # 32 query heads 7-7-6-6-6
    assert largest_share(attrs.evolve(shape, widths=()), 5) == 7 / 32


def test_a_config_without_head_counts_has_no_tensor_shape() -> None:
    assert shape_of({"hidden_size": 64}) is None
    shape = shape_of({"num_attention_heads": 8, "hidden_size": 512})
    assert shape == TensorShape(8, 8, 64, ())  # key-value heads default to the heads


def test_the_largest_share_is_what_the_busiest_rank_holds() -> None:
    assert largest_share(TensorShape(4, 2, 16, (128,)), 2) == 0.5
    assert largest_share(TensorShape(4, 2, 16, (128,)), 3) == 0.5  # heads 2-1-1
    assert largest_share(TensorShape(6, 6, 16, (300,)), 4) == 2 / 6
    assert largest_share(TensorShape(4, 2, 16, (128,)), 5) == 1.0  # refused: the whole
