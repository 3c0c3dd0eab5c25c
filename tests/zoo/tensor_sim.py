"""A tensor split simulated in one process: every rank's part cut by the code the runner runs
(`trexo.engine.tensor_split.split_blocks`), each rank's sums over the ranks answered from
what the ranks put in on the previous pass.

A part (an attention or a feed-forward part of a block) sums over the ranks at most a few
times in a row (a norm over every head, then the output projection). Run every rank on the
same input, recording what each sum is given; run them again with each sum answered from
the previous pass's records. Each pass makes one more sum right, so after one pass more
than the part has sums, every rank's output is the whole part's output, exactly as the
ring's `all_sum` would make it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.utils import load_model

from trexo.engine.sharding import _block_holder
from trexo.engine.tensor_split import split_blocks

MAX_SUMS_IN_A_ROW = 4
"""More than any part of the zoo has (2: a norm over every head, the output projection)."""


class Sums:
    """The sums over the ranks of one pass, answered from the pass before."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self._previous: list[list[mx.array]] = [[] for _ in range(ranks)]
        self._current: list[list[mx.array]] = [[] for _ in range(ranks)]

    def start(self) -> None:
        """Forget every record: a new part, or a new input."""
        self._previous = [[] for _ in range(self.ranks)]
        self._current = [[] for _ in range(self.ranks)]

    def next_pass(self) -> None:
        self._previous, self._current = self._current, [[] for _ in range(self.ranks)]

    def reduce_for(self, rank: int) -> Callable[[mx.array], mx.array]:
        def reduce(x: mx.array) -> mx.array:
            call = len(self._current[rank])
            self._current[rank].append(x)
            previous = [records[call] for records in self._previous if len(records) > call]
            if len(previous) < self.ranks:
                return x  # the first pass: no record yet
            total = previous[0]
            for part in previous[1:]:
                total = total + part
            return total

        return reduce


def split_ranks(model_dir: Path, ranks: int) -> tuple[list[Any], Sums]:
    """`ranks` copies of the model in `model_dir`, each cut to its rank's part."""
    sums = Sums(ranks)
    models = []
    for rank in range(ranks):
        model, _ = load_model(model_dir, lazy=True, strict=False)
        split_blocks(_block_holder(model).layers, rank, ranks, sums.reduce_for(rank))
        mx.eval(model.parameters())
        models.append(model)
    return models, sums


def simulated_outputs(
    parts: Sequence[Callable[[mx.array], mx.array]], sums: Sums, x: mx.array
) -> list[mx.array]:
    """Every rank's output of one part (`parts[rank]`) for the input `x`."""
    outputs: list[mx.array] = []
    sums.start()
    for _ in range(MAX_SUMS_IN_A_ROW + 1):
        outputs = [part(x) for part in parts]
        mx.eval(outputs)
        sums.next_pass()
    return outputs
