"""Waiting in tests: until something holds, with a bound that only catches hangs.

A test that must see something happen from outside (a process, a file, another node's
answer) polls for it with `wait_until` (in trio) or `wait_until_sync` (in a thread or a
synchronous fixture); never a fixed sleep. The check returns what it found (anything
truthy ends the wait and is returned) or something falsy to go on (`NotYet(what_it_saw)`
is falsy and says what it saw). On timeout the error
names what was awaited and the last thing the check returned, so a failure says what the
test saw instead of only that it waited.

A test that needs the opposite — "nothing happens within X" — says so with `holds_for`,
naming the bound and why it proves the point.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import attrs
import trio

T = TypeVar("T")

POLL_S = 0.02
"""How often a condition is checked: short next to any bound, long next to a check."""


@attrs.frozen
class NotYet:
    """A check's falsy answer that says what it saw, for the message if the wait times out."""

    seen: object

    def __bool__(self) -> bool:
        return False


class WaitTimedOut(AssertionError):
    """A condition did not hold within its bound (an `AssertionError`: the test failed)."""


@overload
async def wait_until(
    check: Callable[[], Awaitable[T | NotYet | None]],
    *,
    timeout: float,
    what: str,
    poll: float = POLL_S,
) -> T: ...


@overload
async def wait_until(
    check: Callable[[], T | NotYet | None], *, timeout: float, what: str, poll: float = POLL_S
) -> T: ...


async def wait_until(
    check: Callable[[], Any], *, timeout: float, what: str, poll: float = POLL_S
) -> Any:
    """Call `check` (plain or async) until it returns something truthy; return that."""
    last: object = None
    try:
        with trio.fail_after(timeout):
            while True:
                result = check()
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return result
                last = result
                await trio.sleep(poll)
    except trio.TooSlowError:
        raise WaitTimedOut(f"{what}: not within {timeout} s (last seen: {last!r})") from None


async def wait_answered(
    call: Callable[[], Awaitable[T]],
    *,
    retry_on: type[Exception] | tuple[type[Exception], ...],
    timeout: float,
    what: str,
    poll: float = POLL_S,
) -> T:
    """Call `call` until it returns instead of raising one of `retry_on` (a service not up
    yet answers errors); return what it returned, falsy or not."""

    async def attempt() -> list[T] | NotYet:
        try:
            return [await call()]  # in a list: a falsy answer ends the wait too
        except retry_on as exc:
            return NotYet(exc)

    (answer,) = await wait_until(attempt, timeout=timeout, what=what, poll=poll)
    return answer


def wait_until_sync(
    check: Callable[[], T | NotYet | None], *, timeout: float, what: str, poll: float = POLL_S
) -> T:
    """`wait_until` for code outside trio (synchronous fixtures, browser drivers)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        result = check()
        if result and not isinstance(result, NotYet):
            return result
        last = result
        if time.monotonic() >= deadline:
            raise WaitTimedOut(f"{what}: not within {timeout} s (last seen: {last!r})")
        time.sleep(poll)


async def holds_for(
    check: Callable[[], object], *, seconds: float, what: str, poll: float = POLL_S
) -> None:
    """Fail as soon as `check` returns something falsy within `seconds`: a negative check
    ("nothing happens"), whose `seconds` the caller explains."""
    with trio.move_on_after(seconds):
        while True:
            result = check()
            if inspect.isawaitable(result):
                result = await result
            assert result, f"{what}: broken after less than {seconds} s ({result!r})"
            await trio.sleep(poll)
