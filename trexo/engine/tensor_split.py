"""One rank's part of a model split by tensor: the model's own `shard(group)` where mlx-lm
has one and the split is even, trexo's own per-block split otherwise.

trexo's split works on the blocks' parts, whatever the architecture calls them:

- attention (`self_attn`): the query, key and value projections (separate or fused) keep
  the rows of this rank's heads (`trexo.engine.tensor_shares.head_shares`), the output
  projection the matching input columns, its output summed over the ranks; head counts,
  attention sinks and norms over every head's output follow;
- feed-forward parts (`mlp`, `feed_forward`, `block_sparse_moe`, `shared_mlp`): gate and up
  projections (separate or fused) keep rows of this rank's slice of the width, the down
  projection the matching columns; a mixture of experts splits every expert's width and its
  shared experts' the same way, keeps its router whole, and sums once over the ranks after
  combining the experts;
- state-space and convolution mixers (`linear_attn`, `mamba`, `conv`) are computed whole on
  every rank: exact, at the cost of their weights on every rank.

Partial outputs are summed over the ranks; a bias is added by rank 0 alone. Everything here
runs on the runner's compute thread, on the lazily loaded model, before evaluation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
from mlx.nn.layers.base import Module
from mlx.nn.layers.normalization import RMSNorm

from trexo.engine.tensor_shares import (
    HeadShare,
    head_block,
    head_shares,
    refusal,
    shape_of,
    width_shares,
)
from trexo.engine.wrapped_module import Wrapping
from trexo.types.models import TensorShape

Reduce = Callable[[mx.array], mx.array]

ATTENTION_NAMES = ("self_attn", "attention", "attn")
WHOLE_MIXER_NAMES = ("linear_attn", "mamba", "conv")
"""Mixers computed whole on every rank."""
FEED_FORWARD_NAMES = ("mlp", "feed_forward", "block_sparse_moe", "shared_mlp")
EXPERT_NAMES = ("switch_mlp", "experts")
SHARED_EXPERT_NAMES = ("shared_experts", "shared_expert")
QUERY_COUNT_NAMES = ("n_heads", "num_heads", "num_attention_heads")
KV_COUNT_NAMES = ("n_kv_heads", "num_kv_heads", "num_key_value_heads")
OUTPUT_NAMES = ("o_proj", "out_proj")
LATENT_KV_NAME = "kv_a_proj_with_mqa"
"""Marks latent attention (DeepSeek V2/V3, Kimi K2): one latent key-value for every head."""
LATENT_QUERY_NAMES = ("q_b_proj", "q_proj")
LATENT_PER_HEAD_NAMES = ("embed_q", "unembed_out")
"""Latent attention's per-head matrices (heads first)."""
GATED_PAIRS = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))
UNGATED_PAIRS = (("c_fc", "c_proj"), ("fc1", "fc2"))
FUSED_PAIRS = (("gate_up_proj", "down_proj"), ("input_linear", "output_linear"))
"""A gate and an up projection in one matrix (gate rows first), and the down projection."""
BITS_PER_WORD = 32
"""Quantized weights pack their values into uint32 words."""


def tensor_part(model: Any, blocks: Sequence[Any], config: dict[str, Any], world: Any) -> None:
    """Cut the lazily loaded `model` (its transformer `blocks`) down to this rank's part of a
    tensor split, in place."""
    size = world.size()
    shape = shape_of(config)
    reason = refusal(shape, size) if shape is not None else "its config.json has no head counts"
    if reason is not None:
        raise ValueError(
            f"{type(model).__module__} models cannot be split by tensor over {size} ranks: {reason}"
        )
    assert shape is not None
    if callable(getattr(model, "shard", None)) and _splits_evenly(shape, size):
        model.shard(world)
        return
    if shape.even_only_because:
        raise ValueError(
            f"{type(model).__module__} models cannot be split by tensor over {size} ranks: "
            f"{shape.even_only_because}"
        )

    def reduce(x: mx.array) -> mx.array:
        return mx.distributed.all_sum(x, group=world)

    split_blocks(blocks, world.rank(), size, reduce)


def _splits_evenly(shape: TensorShape, size: int) -> bool:
    """Whether every rank gets as many heads and columns as every other (what mlx-lm's own
    `shard(group)` needs)."""
    kv = () if shape.latent_attention else (shape.n_kv_heads,)
    return all(n % size == 0 for n in (shape.n_heads, *kv, *shape.widths))


def split_blocks(blocks: Sequence[Any], rank: int, size: int, reduce: Reduce) -> None:
    """Keep `rank`'s part of every block, in place; `reduce` sums over the ranks."""
    for index, block in enumerate(blocks):
        parts = 0
        for name in ATTENTION_NAMES:
            if isinstance(attention := block.get(name), Module):
                split_attention(attention, rank, size, reduce)
                parts += 1
        parts += sum(isinstance(block.get(name), Module) for name in WHOLE_MIXER_NAMES)
        for name in FEED_FORWARD_NAMES:
            if isinstance(part := block.get(name), Module):
                setattr(block, name, split_feed_forward(part, rank, size, reduce))
                parts += 1
        if not parts:
            raise ValueError(
                f"block {index} ({type(block).__name__}) has no attention or feed-forward "
                "part trexo knows how to split by tensor"
            )


# --- attention ------------------------------------------------------------------------------


def split_attention(attention: Module, rank: int, size: int, reduce: Reduce) -> None:
    """Keep `rank`'s heads of `attention`, in place."""
    kind = type(attention).__name__
    n_heads = _first_count(attention, QUERY_COUNT_NAMES)
    output_name = next((n for n in OUTPUT_NAMES if isinstance(attention.get(n), Module)), None)
    if n_heads is None or output_name is None:
        raise ValueError(f"{kind} keeps no head count or output projection trexo can split")
    latent = isinstance(attention.get(LATENT_KV_NAME), Module)
    n_kv = 1 if latent else _first_count(attention, KV_COUNT_NAMES) or n_heads
    output = attention[output_name]
    value_width = input_width(output) // n_heads  # each head's share of the output's input
    block = head_block(value_width, _group_size(output))
    shares = head_shares(n_heads, n_kv, size, block)
    if shares is None:
        raise ValueError(f"{kind}'s {n_heads} heads ({n_kv} key-value) cannot split over {size}")
    share = shares[rank]
    q0, q1 = share.queries
    if latent:
        _split_latent_projections(attention, kind, q0, q1, n_heads)
    else:
        _split_projections(attention, kind, share, n_heads, n_kv)
    sliced = slice_inputs(output, q0 * value_width, q1 * value_width, keep_bias=rank == 0)
    setattr(attention, output_name, SummedOverRanks(sliced, reduce))
    _split_head_norms(attention, share, (n_heads, n_kv), value_width, reduce)
    if isinstance(sinks := attention.get("sinks"), mx.array):
        attention.sinks = sinks[q0:q1]
    local_q, local_kv = q1 - q0, share.kv[1] - share.kv[0]
    for name in QUERY_COUNT_NAMES:
        if isinstance(getattr(attention, name, None), int):
            setattr(attention, name, local_q)
    for name in KV_COUNT_NAMES:
        if isinstance(getattr(attention, name, None), int):
            setattr(attention, name, local_kv)
    if isinstance(getattr(attention, "repeats", None), int):
        attention.repeats = local_q // local_kv


def _split_projections(
    attention: Module, kind: str, share: HeadShare, n_heads: int, n_kv: int
) -> None:
    q0, q1 = share.queries
    k0, k1 = share.kv
    fused = attention.get("qkv_proj")
    if isinstance(fused, Module):
        head = output_width(fused) // (n_heads + 2 * n_kv)
        keys_at, values_at = n_heads * head, (n_heads + n_kv) * head
        attention.qkv_proj = slice_outputs(
            fused,
            [
                (q0 * head, q1 * head),
                (keys_at + k0 * head, keys_at + k1 * head),
                (values_at + k0 * head, values_at + k1 * head),
            ],
        )
        return
    queries = attention.get("q_proj")
    if not isinstance(queries, Module):
        raise ValueError(f"{kind} has no q_proj or qkv_proj trexo can split")
    per_query = output_width(queries) // n_heads  # a gated query (Qwen3-Next) is two wide
    attention.q_proj = slice_outputs(queries, [(q0 * per_query, q1 * per_query)])
    for name in ("k_proj", "v_proj"):
        if isinstance(projection := attention.get(name), Module):
            per_kv = output_width(projection) // n_kv
            setattr(attention, name, slice_outputs(projection, [(k0 * per_kv, k1 * per_kv)]))


def _split_latent_projections(attention: Module, kind: str, q0: int, q1: int, n_heads: int) -> None:
    """Latent attention: the query heads' rows and their per-head matrices; the latent key
    and value (and their norms) stay whole on every rank."""
    name = next((n for n in LATENT_QUERY_NAMES if isinstance(attention.get(n), Module)), None)
    if name is None:
        raise ValueError(f"{kind} has no query projection trexo can split")
    queries = attention[name]
    per_query = output_width(queries) // n_heads
    setattr(attention, name, slice_outputs(queries, [(q0 * per_query, q1 * per_query)]))
    for name in LATENT_PER_HEAD_NAMES:
        if isinstance(per_head := attention.get(name), Module):
            for key, array in list(per_head.items()):
                if isinstance(array, mx.array):
                    per_head[key] = mx.contiguous(array[q0:q1])


def _split_head_norms(
    attention: Module, share: HeadShare, counts: tuple[int, int], head: int, reduce: Reduce
) -> None:
    """A norm over every head's output at once (OLMo 2's q/k norms) keeps this rank's part
    and sums its squares over the ranks; a per-head norm stays as it is."""
    for name, count, (start, stop), owned in (
        ("q_norm", counts[0], share.queries, share.queries),
        ("k_norm", counts[1], share.kv, share.owned_kv),
    ):
        norm = attention.get(name)
        weight = norm.get("weight") if isinstance(norm, Module) else None
        if not isinstance(weight, mx.array) or weight.shape[-1] in (head, 0) or count == 1:
            continue
        if weight.shape[-1] != count * head or not isinstance(norm, RMSNorm):
            raise ValueError(
                f"{type(attention).__name__}.{name} ({type(norm).__name__} over "
                f"{weight.shape[-1]}) cannot be split by heads of {head}"
            )
        setattr(
            attention,
            name,
            SpanRMSNorm(
                weight[start * head : stop * head],
                norm.eps,
                full_width=count * head,
                owned=((owned[0] - start) * head, (owned[1] - start) * head),
                reduce=reduce,
            ),
        )


class SpanRMSNorm(Module):
    """An RMS norm over a width split across ranks: each rank normalizes its part by the
    squares of the whole width, summing the squares of the part it owns."""

    def __init__(
        self,
        weight: mx.array,
        eps: float,
        *,
        full_width: int,
        owned: tuple[int, int],
        reduce: Reduce,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.weight = weight
        self.eps = eps
        self._full_width = full_width
        self._owned = owned
        self._reduce = reduce

    def __call__(self, x: mx.array) -> mx.array:
        wide = x.astype(mx.float32)
        start, stop = self._owned
        squares = self._reduce(mx.square(wide[..., start:stop]).sum(axis=-1, keepdims=True))
        scale = mx.rsqrt(squares / self._full_width + self.eps)
        return (wide * scale * self.weight).astype(x.dtype)


# --- feed-forward ---------------------------------------------------------------------------


def split_feed_forward(part: Module, rank: int, size: int, reduce: Reduce) -> Module:
    """`rank`'s slice of a feed-forward part (dense or a mixture of experts), summed over
    the ranks: what replaces `part` in its block."""
    experts = next((e for n in EXPERT_NAMES if isinstance(e := part.get(n), Module)), None)
    if experts is None:
        _split_dense(part, rank, size)
        return SummedOverRanks(part, reduce)
    _split_dense(experts, rank, size)
    for name in SHARED_EXPERT_NAMES:
        if isinstance(shared := part.get(name), Module):
            _split_dense(shared, rank, size)
    return SummedOverRanks(part, reduce)


def _split_dense(part: Module, rank: int, size: int) -> None:
    """Keep `rank`'s slice of the width of a feed-forward part (no sum: the caller's)."""
    kind = type(part).__name__
    for gate_name, up_name, down_name in GATED_PAIRS:
        gate, up, down = (part.get(n) for n in (gate_name, up_name, down_name))
        if isinstance(gate, Module) and isinstance(up, Module) and isinstance(down, Module):
            start, stop = _width_share(down, rank, size, kind)
            setattr(part, gate_name, slice_outputs(gate, [(start, stop)]))
            setattr(part, up_name, slice_outputs(up, [(start, stop)]))
            setattr(part, down_name, slice_inputs(down, start, stop, keep_bias=rank == 0))
            return
    for fused_name, down_name in FUSED_PAIRS:
        fused, down = part.get(fused_name), part.get(down_name)
        if isinstance(fused, Module) and isinstance(down, Module):
            width = input_width(down)
            start, stop = _width_share(down, rank, size, kind)
            setattr(
                part,
                fused_name,
                slice_outputs(fused, [(start, stop), (width + start, width + stop)]),
            )
            setattr(part, down_name, slice_inputs(down, start, stop, keep_bias=rank == 0))
            return
    for up_name, down_name in UNGATED_PAIRS:
        up, down = part.get(up_name), part.get(down_name)
        if isinstance(up, Module) and isinstance(down, Module):
            start, stop = _width_share(down, rank, size, kind)
            setattr(part, up_name, slice_outputs(up, [(start, stop)]))
            setattr(part, down_name, slice_inputs(down, start, stop, keep_bias=rank == 0))
            return
    raise ValueError(f"{kind} has no feed-forward projections trexo knows how to split")


def _width_share(down: Module, rank: int, size: int, kind: str) -> tuple[int, int]:
    width = input_width(down)
    group = _group_size(down)
    shares = width_shares(width, size, group if group and width % group == 0 else 1)
    if shares is None:
        raise ValueError(f"{kind}'s width {width} cannot be split over {size} ranks")
    return shares[rank]


# --- matrices -------------------------------------------------------------------------------


def _group_size(linear: Module) -> int:
    """The quantization group of a quantized linear layer (0: not quantized)."""
    return int(getattr(linear, "group_size", 0)) if "scales" in linear else 0


def _packing(linear: Module) -> int:
    """Values per stored weight element along the input width."""
    return BITS_PER_WORD // int(linear.bits) if "scales" in linear else 1


def input_width(linear: Module) -> int:
    return int(linear["weight"].shape[-1]) * _packing(linear)


def output_width(linear: Module) -> int:
    return int(linear["weight"].shape[-2])


def slice_outputs(linear: Module, ranges: Sequence[tuple[int, int]]) -> Module:
    """`linear` keeping only the output rows in `ranges` (in order), in place."""
    for name in ("weight", "scales", "biases", "bias"):
        if isinstance(array := linear.get(name), mx.array):
            axis = array.ndim - 1 if name == "bias" else array.ndim - 2
            linear[name] = _take(array, axis, ranges)
    return linear


def slice_inputs(linear: Module, start: int, stop: int, *, keep_bias: bool) -> Module:
    """`linear` keeping only the input columns `[start, stop)`, in place; its bias only if
    `keep_bias` (one rank adds it to the sum)."""
    group, packing = _group_size(linear), _packing(linear)
    if group and (start % group or stop % group):
        raise ValueError(
            f"a quantized matrix splits its input only at multiples of {group}, "
            f"not at [{start}, {stop})"
        )
    for name, unit in (("weight", packing), ("scales", group), ("biases", group)):
        if isinstance(array := linear.get(name), mx.array):
            linear[name] = _take(array, array.ndim - 1, [(start // unit, stop // unit)])
    if "bias" in linear and not keep_bias:
        del linear["bias"]
    return linear


def _take(array: mx.array, axis: int, ranges: Sequence[tuple[int, int]]) -> mx.array:
    lead = (slice(None),) * axis
    parts = [array[(*lead, slice(start, stop))] for start, stop in ranges]
    return mx.contiguous(parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=axis))


class SummedOverRanks(Wrapping):
    """A part whose output, computed from this rank's slices, is summed over the ranks.
    Its other attributes are the part's."""

    INNER = "part"

    def __init__(self, part: Module, reduce: Reduce) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.part = part
        self._reduce = reduce

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._reduce(self.part(*args, **kwargs))


def _first_count(module: Module, names: Sequence[str]) -> int | None:
    for name in names:
        value = getattr(module, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
