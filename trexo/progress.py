"""Bounds on silence, not on work.

Loading a model takes as long as the model is large and the machine is busy: a fixed bound
on it is either too short for a big model on a loaded machine or useless against a runner
that hangs. So a wait on such work gives up only once the worker has shown no sign of
progress for a while. The signs are what the operating system counts for the worker's
process: CPU time it used and bytes it read (a load reads the weights, then computes).

`SilenceWatch` is the pure rule (fed samples, it says when the silence has lasted too long);
`wait_while_progressing` is the thin shell that samples a process while a wait runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs
import psutil
import trio

from trexo.config import PROGRESS_MIN_CPU_S, PROGRESS_MIN_READ_BYTES, PROGRESS_POLL_S

T = TypeVar("T")


@attrs.frozen
class Effort:
    """What a process has done so far: CPU seconds used and bytes read."""

    cpu_s: float
    read_bytes: int


class Silent(Exception):
    """The watched work showed no progress for the whole bound."""


@attrs.define
class SilenceWatch:
    """When the work last progressed. A sample counts as progress when, since the last one
    that did, the process used at least `min_cpu_s` of CPU or read `min_read_bytes`: an idle
    process blocked on a lock or a socket ticks a few milliseconds at most."""

    silence: float
    started_at: float
    min_cpu_s: float = PROGRESS_MIN_CPU_S
    min_read_bytes: int = PROGRESS_MIN_READ_BYTES
    _mark: Effort | None = None
    _progressed_at: float = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._progressed_at = self.started_at

    def observe(self, now: float, effort: Effort | None) -> None:
        """Take a sample (None: the process could not be read, which is no progress)."""
        if effort is None:
            return
        mark = self._mark
        if (
            mark is None
            or effort.cpu_s - mark.cpu_s >= self.min_cpu_s
            or effort.read_bytes - mark.read_bytes >= self.min_read_bytes
        ):
            if mark is not None:
                self._progressed_at = now
            self._mark = effort

    def expired(self, now: float) -> bool:
        return now - self._progressed_at >= self.silence

    @property
    def progressed_at(self) -> float:
        return self._progressed_at


def process_effort(pid: int) -> Effort | None:
    """`pid`'s CPU time and bytes read so far; None if it cannot be read (it has exited)."""
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            times = process.cpu_times()
            try:
                read = process.io_counters().read_bytes
            except (AttributeError, psutil.AccessDenied):  # not counted on every platform
                read = 0
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None
    return Effort(times.user + times.system, read)


async def wait_while_progressing(
    wait: Callable[[], Awaitable[T]],
    effort: Callable[[], Effort | None],
    *,
    silence: float,
    poll: float = PROGRESS_POLL_S,
    min_cpu_s: float = PROGRESS_MIN_CPU_S,
) -> T:
    """`await wait()`; raise `Silent` once `effort()` shows no progress for `silence` s."""
    watch = SilenceWatch(silence, trio.current_time(), min_cpu_s=min_cpu_s)
    result: list[T] = []
    async with trio.open_nursery() as nursery:

        async def waiting() -> None:
            result.append(await wait())
            nursery.cancel_scope.cancel()

        nursery.start_soon(waiting)
        while True:
            watch.observe(trio.current_time(), effort())
            if watch.expired(trio.current_time()):
                break
            await trio.sleep(poll)
        nursery.cancel_scope.cancel()
    if result:
        return result[0]
    raise Silent(f"no progress for {silence:.0f} s")
