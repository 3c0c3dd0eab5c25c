"""The process's file descriptor budget: raise the soft limit at start, recognise exhaustion.

Every HTTP client, peer link, runner (a socket and a pipe) and log file holds a descriptor.
The usual soft limit (1024 on Linux, 256 on macOS) is reached by ~1000 idle HTTP clients,
while the hard limit is usually far higher, so a node raises its soft limit to the hard one.
"""

from __future__ import annotations

import errno
import logging
import math
import resource
from collections.abc import Callable
from typing import TypeVar

import attrs
import trio

from trexo.config import FD_LIMIT_FALLBACK

log = logging.getLogger(__name__)

T = TypeVar("T")

FD_EXHAUSTION_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
"""The process (EMFILE) or the whole system (ENFILE) is out of file descriptors."""


@attrs.frozen
class FdLimit:
    """The soft limit before and after `raise_fd_limit`, and the hard limit."""

    before: int
    soft: int
    hard: int


def fd_soft_limit() -> int:
    """The process's current soft limit on open file descriptors."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def raise_fd_limit(fallback: int = FD_LIMIT_FALLBACK) -> FdLimit:
    """Raise the soft file descriptor limit to the hard limit, or to `fallback` where the
    system refuses that (macOS, for "unlimited"); never lowers it. Logs the figures."""
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = before
    for target in (hard, fallback):
        if _size(target) <= _size(soft) or _size(target) > _size(hard):
            continue
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue
        soft = target
        break
    limit = FdLimit(before, soft, hard)
    log.info(
        "file descriptor limit: %s (was %s; hard limit %s)",
        _show(soft),
        _show(before),
        _show(hard),
    )
    return limit


def _size(value: int) -> float:
    return math.inf if value == resource.RLIM_INFINITY else value


def _show(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


def is_fd_exhaustion(exc: BaseException) -> bool:
    """Whether `exc` says that no file descriptor was left to open something."""
    return isinstance(exc, OSError) and exc.errno in FD_EXHAUSTION_ERRNOS


async def retry_on_fd_exhaustion(
    fn: Callable[[], T],
    *,
    what: str,
    attempts: int,
    interval: float,
    limiter: trio.CapacityLimiter | None = None,
) -> T:
    """`fn()` in a worker thread (of `limiter`: trio's default if None), tried again while it
    fails for lack of file descriptors.

    Each failure is one log line (no traceback); after `attempts` of them the error is raised.
    """
    for attempt in range(1, attempts + 1):
        try:
            return await trio.to_thread.run_sync(fn, limiter=limiter)
        except OSError as exc:
            if not is_fd_exhaustion(exc):
                raise
            if attempt == attempts:
                log.error("%s: %s; giving up after %d attempts", what, exc.strerror, attempts)
                raise
            log.warning(
                "%s: %s (attempt %d of %d); trying again in %g s",
                what,
                exc.strerror,
                attempt,
                attempts,
                interval,
            )
        await trio.sleep(interval)
    raise ValueError(f"attempts must be at least 1, not {attempts}")
