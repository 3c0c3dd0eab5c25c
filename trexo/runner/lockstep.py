"""What keeps the ranks of a split model in step: rank 0's next step, and a stall watch.

Every rank runs the same generations at the same steps. Rank 0 decides each `GroupStep` and
shares it through the group itself (`trexo.engine.sharding.GroupLink`); a frozen peer is
noticed by `StallWatch`, which the runner's trio side reads (it never blocks on MLX).
No MLX here: the trio side imports this module.
"""

from __future__ import annotations

import time

import attrs

from trexo import wire
from trexo.errors import WireError
from trexo.types.generation import GenerationRequest
from trexo.types.ids import RequestId

IDLE_STEP_BYTES = b""
"""An idle step travels as nothing at all: one scalar collective per tick."""


@attrs.frozen
class GroupStep:
    """What every rank does before its next batch step, as rank 0 decided it (nothing, with
    no generation running: an idle tick).

    `start`: generations that join the batch; `cancel`: generations that leave it.
    """

    start: tuple[GenerationRequest, ...] = ()
    cancel: tuple[RequestId, ...] = ()


class StepUndecodable(Exception):
    """Rank 0 shared bytes that are not a `GroupStep` (ranks of different versions?)."""


def encode_step(step: GroupStep) -> bytes:
    return IDLE_STEP_BYTES if step == GroupStep() else wire.to_json(step, GroupStep)


def decode_step(data: bytes) -> GroupStep:
    if data == IDLE_STEP_BYTES:
        return GroupStep()
    try:
        step: GroupStep = wire.from_json(data, GroupStep)
    except WireError as exc:
        raise StepUndecodable(str(exc)) from exc
    return step


class StallWatch:
    """How long the compute thread has waited on its peers without hearing from them.

    Written by the compute thread, read by the trio side's watchdog (one float attribute:
    atomic under the GIL). A stretch of group work starts the clock; every collective that
    completes restarts it; rank 0 resting on its own job queue stops it. A generation's
    model collectives (hidden states, all-reduces) are inside mlx-lm's steps, so what is
    measured is the time since the last completed control collective: one step of the
    slowest rank when all is well.
    """

    def __init__(self) -> None:
        self._since: float | None = None

    def waiting(self) -> None:
        if self._since is None:
            self._since = time.monotonic()

    def heard(self) -> None:
        self._since = time.monotonic()

    def rest(self) -> None:
        self._since = None

    def waited(self, now: float | None = None) -> float:
        """Seconds since the clock started; 0.0 while stopped."""
        since = self._since
        if since is None:
            return 0.0
        return (time.monotonic() if now is None else now) - since
