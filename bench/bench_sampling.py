"""What a request with a `top_p` / `min_p` value never seen before costs, against a seen one.

MLX compiles a compiled function again for every new Python float it is given: mlx-lm's
`make_sampler` passes the values as floats, so each new value compiles its filters (~1 s on a
quiet 2-core machine, 3-7 s when loaded). trexo's `request_sampler` passes arrays. For K
rounds, interleaved, one sampling step (one token from 2k-vocabulary log-probabilities) is
timed with a new value and with a value seen before, for both. Run: `nox -s bench-sampling`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
from mlx_lm.sample_utils import make_sampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import describe, markdown_value_table, write_results
from trexo.engine.batch import request_sampler
from trexo.types.generation import SamplingParams

VOCAB = 2048
TEMPERATURE = 0.7
Sampler = Callable[[mx.array], mx.array]


def trexo_sampler(top_p: float, min_p: float) -> Sampler:
    sampler = request_sampler(SamplingParams(temperature=TEMPERATURE, top_p=top_p, min_p=min_p), 0)
    assert sampler is not None
    return sampler


def mlx_lm_sampler(top_p: float, min_p: float) -> Sampler:
    sampler: Sampler = make_sampler(TEMPERATURE, top_p=top_p, min_p=min_p)
    return sampler


def step_ms(make: Callable[[float, float], Sampler], value: float, logprobs: mx.array) -> float:
    sampler = make(value, value / 10)
    started = time.perf_counter()
    mx.eval(sampler(logprobs))
    return (time.perf_counter() - started) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-k", "--rounds", type=int, default=12)
    args = parser.parse_args()
    logits = mx.random.normal((1, VOCAB))
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    seen = 0.9
    samples: dict[str, list[float]] = {}
    for make in (trexo_sampler, mlx_lm_sampler):
        step_ms(make, seen, logprobs)  # compiled once for each: "seen" from here on
    for k in range(args.rounds):
        new = 0.5 + k * 0.0137  # a value neither has seen
        for name, make in (("trexo", trexo_sampler), ("mlx-lm make_sampler", mlx_lm_sampler)):
            samples.setdefault(f"{name}: new value", []).append(step_ms(make, new, logprobs))
            samples.setdefault(f"{name}: seen value", []).append(step_ms(make, seen, logprobs))
    rows = {name: describe(values, "ms", 2) for name, values in samples.items()}
    for name in ("trexo", "mlx-lm make_sampler"):
        new = rows[f"{name}: new value"]["median"]
        seen_ms = rows[f"{name}: seen value"]["median"]
        rows[f"{name}: new / seen"] = describe([new / seen_ms], "x", 1)
    print(markdown_value_table(rows))
    print(f"written to {write_results('sampling', {'rounds': args.rounds, 'rows': rows})}")


if __name__ == "__main__":
    main()
