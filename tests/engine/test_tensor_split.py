"""trexo's tensor split of single matrices and norms, in one process: the slices of a float
or quantized (mixture-of-experts too) matrix sum to the whole product, a norm over a width
split across ranks normalizes by the whole width, and a misaligned quantized cut is
refused."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.switch_layers import SwitchLinear

from trexo.engine.tensor_shares import width_shares
from trexo.engine.tensor_split import SpanRMSNorm, slice_inputs, slice_outputs

IN, OUT, EXPERTS, GROUP = 128, 96, 3, 32
TOLERANCE = 1e-4


def linear(quantized: bool, bias: bool = True) -> nn.Module:
    layer = nn.Linear(IN, OUT, bias=bias)
    if bias:
        layer.bias = mx.random.normal((OUT,), key=mx.random.key(3))
    mx.eval(layer.parameters())
    return nn.QuantizedLinear.from_linear(layer, GROUP, 4) if quantized else layer


def switch_linear(quantized: bool) -> nn.Module:
    layer = SwitchLinear(IN, OUT, EXPERTS, bias=True)
    layer.bias = mx.random.normal((EXPERTS, OUT), key=mx.random.key(4))
    mx.eval(layer.parameters())
    return layer.to_quantized(GROUP, 4) if quantized else layer


def copies(make: Callable[[], nn.Module], count: int) -> list[nn.Module]:
    whole = make()
    parts = []
    for _ in range(count):
        part = make()
        part.update(whole.parameters())
        parts.append(part)
    return [whole, *parts]


def close(a: mx.array, b: mx.array) -> bool:
    return float(mx.abs(a - b).max()) <= TOLERANCE * max(1.0, float(mx.abs(b).max()))


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("ranks", [2, 3])
def test_input_slices_of_a_matrix_sum_to_the_whole_product(quantized: bool, ranks: int) -> None:
    x = mx.random.normal((2, 5, IN), key=mx.random.key(1))
    whole, *parts = copies(lambda: linear(quantized), ranks)
    shares = width_shares(IN, ranks, GROUP if quantized else 1)
    assert shares is not None
    total = mx.zeros((2, 5, OUT))
    for rank, (part, (start, stop)) in enumerate(zip(parts, shares, strict=True)):
        sliced = slice_inputs(part, start, stop, keep_bias=rank == 0)
        total = total + sliced(x[..., start:stop])
    assert close(total, whole(x))


@pytest.mark.parametrize("quantized", [False, True])
def test_output_slices_of_a_matrix_are_its_rows_in_order(quantized: bool) -> None:
    x = mx.random.normal((4, IN), key=mx.random.key(2))
    whole, part = copies(lambda: linear(quantized), 1)
    ranges = [(0, 16), (48, 64)]  # a fused projection keeps a range of each segment
    got = slice_outputs(part, ranges)(x)
    expected = whole(x)
    assert close(got, mx.concatenate([expected[:, a:b] for a, b in ranges], axis=-1))


@pytest.mark.parametrize("quantized", [False, True])
def test_every_expert_of_a_mixture_splits_the_same_way(quantized: bool) -> None:
    x = mx.random.normal((2, 5, 1, 1, IN), key=mx.random.key(5))
    experts = mx.array([[[0, 2]] * 5] * 2)  # each token through experts 0 and 2
    whole, first, second = copies(lambda: switch_linear(quantized), 2)
    half = IN // 2
    total = slice_inputs(first, 0, half, keep_bias=True)(x[..., :half], experts)
    total = total + slice_inputs(second, half, IN, keep_bias=False)(x[..., half:], experts)
    assert close(total, whole(x, experts))


def test_a_quantized_matrix_is_not_cut_inside_a_quantization_group() -> None:
    with pytest.raises(ValueError, match=f"only at multiples of {GROUP}"):
        slice_inputs(linear(True), 0, GROUP // 2, keep_bias=True)


def test_a_norm_over_a_split_width_normalizes_by_the_whole_width() -> None:
    width, eps = 48, 1e-5
    norm = nn.RMSNorm(width, eps=eps)
    norm.weight = mx.random.normal((width,), key=mx.random.key(6))
    x = mx.random.normal((3, width), key=mx.random.key(7))
    spans = [(0, 16), (16, 48)]
    squares = sum(mx.square(x[..., a:b]).sum(axis=-1, keepdims=True) for a, b in spans)
    for start, stop in spans:
        part = SpanRMSNorm(
            norm.weight[start:stop],
            eps,
            full_width=width,
            owned=(0, stop - start),
            reduce=lambda _mine: squares,  # every rank's squares, as the ring sums them
        )
        assert close(part(x[..., start:stop]), norm(x)[..., start:stop])
