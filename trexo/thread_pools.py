"""Worker threads, bounded per kind of blocking work.

`trio.to_thread.run_sync` without a limiter takes one of trio's 40 default tokens, shared by
everything in the process. Some work holds a thread for as long as an outsider wants: a hub
that drips its answer, a chat template that loops. Sharing one pool, 41 such requests left
the master's event log without a thread: commands stopped, and a node told to stop waited
forever for its log's last fsync. So each kind of work takes threads from its own limiter,
and what one kind holds, no other kind waits for.

A limiter lives as long as one `trio.run` (a `RunVar`), like trio's own default.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Literal, TypeVar, TypeVarTuple

import trio

from trexo.config import EVENT_LOG_THREADS, FILE_THREADS, HUB_THREADS, PROMPT_THREADS

ThreadKind = Literal["event_log", "prompts", "hub", "files"]
T = TypeVar("T")
Ts = TypeVarTuple("Ts")

SIZES: Final[dict[ThreadKind, int]] = {
    "event_log": EVENT_LOG_THREADS,
    "prompts": PROMPT_THREADS,
    "hub": HUB_THREADS,
    "files": FILE_THREADS,
}
"""Threads per kind: the master's log (writes, fsyncs, snapshots), tokenizers and prompt
counting, hub look-ups, and reads of model files and system figures."""

_limiters: trio.lowlevel.RunVar[dict[ThreadKind, trio.CapacityLimiter]] = trio.lowlevel.RunVar(
    "trexo_thread_limiters"
)


def limiter(kind: ThreadKind) -> trio.CapacityLimiter:
    """The limiter of `kind`'s threads in this trio run."""
    try:
        limiters = _limiters.get()
    except LookupError:
        limiters = {}
        _limiters.set(limiters)
    found = limiters.get(kind)
    if found is None:
        found = limiters[kind] = trio.CapacityLimiter(SIZES[kind])
    return found


async def run_sync(
    kind: ThreadKind,
    fn: Callable[[*Ts], T],
    *args: *Ts,
    abandon_on_cancel: bool = False,
) -> T:
    """`trio.to_thread.run_sync(fn, *args)` in one of `kind`'s threads."""
    return await trio.to_thread.run_sync(
        fn, *args, limiter=limiter(kind), abandon_on_cancel=abandon_on_cancel
    )
