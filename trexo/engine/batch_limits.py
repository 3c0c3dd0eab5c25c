"""Architectures whose batched forward pass in this mlx-lm gives wrong output, and the
batch size each is served with instead. A pure lookup.

A runner steps its generations together (continuous batching). Where mlx-lm's model code
is wrong for a batch, serving one generation at a time is slower but right: its requests
wait in the runner's queue instead of sharing a step. Each entry says what goes wrong, so
it can be dropped once mlx-lm is fixed (the zoo's batching test shows when).
"""

from __future__ import annotations

from typing import Any, Final

BATCH_LIMITS: Final[dict[str, tuple[int, str]]] = {
    "gemma2": (
        1,
        "mlx-lm 0.32's gemma2 applies a batch's (B, 1, L, S) attention mask to scores shaped "
        "(B, kv_heads, repeats, L, S): wrong text or a broadcast error with two or more "
        "generations in a batch, on every gemma-2 with fewer KV heads than heads",
    ),
}
"""By `model_type`: the largest batch that is right, and why the limit."""


def batch_limit(model: Any, requested: int) -> int:
    """The batch size to serve `model` with: `requested`, or less where batching is wrong."""
    limit = BATCH_LIMITS.get(str(getattr(model, "model_type", "")))
    return requested if limit is None else min(requested, limit[0])
