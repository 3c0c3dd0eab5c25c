"""Sampling filters take their values as arrays: the same tokens as mlx-lm's filters, and a
new `top_p` / `min_p` value compiles nothing new (a compiled function given a Python float
compiles again for each new value)."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest
from mlx_lm.sample_utils import apply_min_p, apply_top_p

from trexo.engine.batch import _min_p, request_sampler
from trexo.types.generation import SamplingParams


@pytest.fixture(scope="module")
def logprobs() -> mx.array:
    mx.random.seed(0)
    logits = mx.random.normal((2, 512)) * 3
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


@pytest.mark.parametrize("min_p", [0.001, 0.05, 0.3, 0.9, 1.0])
def test_min_p_keeps_what_mlx_lms_filter_keeps(logprobs: mx.array, min_p: float) -> None:
    ours = _min_p(logprobs, mx.array(math.log(min_p)))
    theirs = apply_min_p(logprobs, min_p, 1)
    assert mx.array_equal(mx.isinf(ours), mx.isinf(theirs)).item()


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.95])
def test_top_p_given_as_an_array_keeps_what_a_float_keeps(logprobs: mx.array, top_p: float) -> None:
    as_array = apply_top_p(logprobs, mx.array(top_p, dtype=mx.float32))  # type: ignore[arg-type]
    assert mx.array_equal(mx.isinf(as_array), mx.isinf(apply_top_p(logprobs, top_p))).item()


def test_seeded_samplers_with_any_values_draw_the_same_tokens_again(logprobs: mx.array) -> None:
    for top_p, min_p in [(0.9, 0.0), (0.77, 0.01), (0.5, 0.2)]:
        params = SamplingParams(temperature=0.8, top_p=top_p, min_p=min_p)
        first, again = request_sampler(params, 7), request_sampler(params, 7)
        assert first is not None and again is not None
        draws = [first(logprobs).tolist() for _ in range(5)]
        assert draws == [again(logprobs).tolist() for _ in range(5)]
