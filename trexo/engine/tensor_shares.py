"""How a tensor split divides a model's heads and widths among its ranks: pure arithmetic,
shared by placement (from `config.json` alone) and the runner (from the loaded modules), so
that a layout placement proposes is a layout that loads.

A split is exact when every rank computes whole attention heads and whole slices of the
feed-forward widths, and the partial outputs are summed. Ranks need not get equal shares:
over 3 ranks, 4 query heads go 2-1-1 and an intermediate width of 128 goes 43-43-42. Key-value
heads follow the query heads that read them: where ranks outnumber them, a key-value head is
computed on every rank whose query heads read it (each rank's query heads stay within one
key-value group, so grouped attention maps them as in the whole model). Quantized matrices
split their input width only at multiples of the quantization group.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from trexo.engine.pipeline_cuts import text_config
from trexo.types.models import TensorShape

FEED_FORWARD_WIDTH_FIELDS = (
    "intermediate_size",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "shared_intermediate_size",
)
"""`config.json` fields that are feed-forward widths, where architectures name them."""
MLA_MODEL_TYPES = frozenset(
    {"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "kimi_k25", "glm4_moe_lite"}
)
"""Multi-head latent attention: one latent key-value, shared by every head."""


def even_shares(count: int, ranks: int) -> list[int] | None:
    """`count` units over `ranks`, as even as can be (earlier ranks take the remainder);
    None if some rank would get none."""
    if ranks <= 0 or count < ranks:
        return None
    base, extra = divmod(count, ranks)
    return [base + (rank < extra) for rank in range(ranks)]


def spans(shares: Sequence[int], unit: int = 1) -> list[tuple[int, int]]:
    """Consecutive `[start, stop)` ranges of `shares` units of `unit` each."""
    bounds = [0]
    for share in shares:
        bounds.append(bounds[-1] + share * unit)
    return list(itertools.pairwise(bounds))


@attrs.frozen
class HeadShare:
    """One rank's attention heads: its query heads and the key-value heads they read."""

    queries: tuple[int, int]
    """`[start, stop)` of the query heads."""
    kv: tuple[int, int]
    """`[start, stop)` of the key-value heads those query heads read."""
    owned_kv: tuple[int, int]
    """The part of `kv` no earlier rank holds (a norm over every key-value head counts each
    once)."""


def head_shares(
    n_heads: int, n_kv_heads: int, ranks: int, block: int = 1
) -> list[HeadShare] | None:
    """Each rank's heads, or None if they cannot be split exactly over `ranks`.

    `block`: query heads that must stay together (a quantized output projection splits its
    input only at whole quantization groups).
    """
    if n_kv_heads <= 0 or n_heads % n_kv_heads or n_heads % block:
        return None
    group = n_heads // n_kv_heads  # query heads per key-value head
    if n_kv_heads >= ranks:
        # Whole key-value groups per rank: nothing computed twice.
        per_rank = even_shares(n_kv_heads, ranks)
        if per_rank is None or any((share * group) % block for share in per_rank):
            return None
        kv_spans = spans(per_rank)
        return [
            HeadShare((start * group, stop * group), (start, stop), (start, stop))
            for start, stop in kv_spans
        ]
    # More ranks than key-value heads: each key-value group's query heads are split among
    # the ranks given to it, and each of those ranks computes that key-value head.
    ranks_per_group = even_shares(ranks, n_kv_heads)
    if ranks_per_group is None:
        return None
    shares: list[HeadShare] = []
    for kv, group_ranks in enumerate(ranks_per_group):
        heads = even_shares(group // block, group_ranks) if group % block == 0 else None
        if heads is None:
            return None
        for index, (start, stop) in enumerate(spans(heads, block)):
            owned = (kv, kv + 1) if index == 0 else (kv + 1, kv + 1)
            base = kv * group
            shares.append(HeadShare((base + start, base + stop), (kv, kv + 1), owned))
    return shares


def width_shares(width: int, ranks: int, granule: int = 1) -> list[tuple[int, int]] | None:
    """Each rank's `[start, stop)` of a feed-forward width, in whole `granule`s; None if some
    rank would get none."""
    if granule <= 0 or width % granule:
        return None
    shares = even_shares(width // granule, ranks)
    return None if shares is None else spans(shares, granule)


def shape_of(config: Mapping[str, Any]) -> TensorShape | None:
    """The tensor shape in a `config.json` (a vision-language model's `text_config`), or None
    if it lacks the head counts."""
    text = text_config(config)
    n_heads = text.get("num_attention_heads")
    if not isinstance(n_heads, int) or n_heads <= 0:
        return None
    n_kv = text.get("num_key_value_heads")
    n_kv_heads = n_kv if isinstance(n_kv, int) and n_kv > 0 else n_heads
    hidden = text.get("hidden_size")
    head_dim = text.get("head_dim")
    if not isinstance(head_dim, int):
        head_dim = hidden // n_heads if isinstance(hidden, int) else 0
    widths = tuple(
        value
        for field in FEED_FORWARD_WIDTH_FIELDS
        if isinstance(value := text.get(field), int) and value > 0
    )
    quantization = config.get("quantization")
    group_size = 0
    if isinstance(quantization, Mapping) and isinstance(quantization.get("group_size"), int):
        group_size = int(quantization["group_size"])
    model_type = text.get("model_type", config.get("model_type"))
    latent = model_type in MLA_MODEL_TYPES
    if latent and isinstance(text.get("v_head_dim"), int):
        head_dim = text["v_head_dim"]  # each head's share of the output projection's input
    return TensorShape(n_heads, n_kv_heads, head_dim, widths, group_size, latent_attention=latent)


def kv_heads(shape: TensorShape) -> int:
    """The key-value heads the query heads read: one latent one for latent attention."""
    return 1 if shape.latent_attention else shape.n_kv_heads


def head_block(head_dim: int, group_size: int) -> int:
    """Query heads that must stay together so the output projection's input splits at whole
    quantization groups."""
    if group_size <= 0 or head_dim <= 0:
        return 1
    return group_size // math.gcd(head_dim, group_size)


def refusal(shape: TensorShape, ranks: int) -> str | None:
    """Why `shape` cannot be split by tensor over `ranks`, or None if it can."""
    if ranks < 2:
        return None
    if shape.even_only_because:
        odd = [
            f"{name} ({value})"
            for name, value in (
                ("attention heads", shape.n_heads),
                ("key-value heads", shape.n_kv_heads),
                *(("feed-forward width", width) for width in shape.widths),
            )
            if value % ranks
        ]
        if odd:
            verb = "is" if len(odd) == 1 else "are"
            return (
                f"its {', '.join(odd)} {verb} not divisible by {ranks} ({shape.even_only_because})"
            )
    block = head_block(shape.head_dim, shape.group_size)
    if head_shares(shape.n_heads, kv_heads(shape), ranks, block) is None:
        quantized = f" in blocks of {block} (quantized in groups of {shape.group_size})"
        return (
            f"its {shape.n_heads} attention heads ({shape.n_kv_heads} key-value) "
            f"cannot be split over {ranks} ranks{quantized if block > 1 else ''}"
        )
    granule = max(shape.group_size, 1)
    for width in shape.widths:
        if width_shares(width, ranks, granule if width % granule == 0 else 1) is None:
            return f"its feed-forward width {width} cannot be split over {ranks} ranks"
    return None


def largest_share(shape: TensorShape, ranks: int) -> float:
    """The largest fraction of the blocks' weights one of `ranks` holds (1/ranks when even;
    1.0 when the split is refused)."""
    if ranks <= 1:
        return 1.0
    heads = head_shares(shape.n_heads, kv_heads(shape), ranks)
    widths = [width_shares(width, ranks) for width in shape.widths]
    if heads is None or any(w is None for w in widths):
        return 1.0
    fractions = [max(h.queries[1] - h.queries[0] for h in heads) / shape.n_heads]
    fractions += [
        max(b - a for a, b in w) / width for w, width in zip(widths, shape.widths, strict=True) if w
    ]
    return max(fractions)
