"""The service protocol, and the supervisor that runs one generation of services per session.

A service is a nursery (README, Architecture): stop is cancellation, stopped is return. The
`SessionSupervisor` swaps generations so that two never overlap, and restarts a crashed one
with backoff under an Erlang/OTP-style restart intensity.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any, Generic, Protocol, TypeVar

import attrs
import trio

from trexo.config import RestartPolicy
from trexo.errors import SupervisorGaveUp

logger = logging.getLogger(__name__)

S = TypeVar("S")
S_contra = TypeVar("S_contra", contravariant=True)


class Service(Protocol):
    """A long-lived component whose `run` owns a nursery; stop it by cancelling its scope."""

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled, calling `task_status.started()` once ready."""
        ...


class Generation(Protocol[S_contra]):
    """Runs one session's services in its own nursery; calls `task_status.started()` when ready."""

    def __call__(self, session: S_contra, *, task_status: trio.TaskStatus[Any]) -> Awaitable[None]:
        """Serve `session` until cancelled (or return early when there is nothing left to do)."""
        ...


# --- restart intensity (pure) --------------------------------------------------------------


@attrs.frozen
class RestartIntensity:
    """Restart timestamps in a sliding window: at most `max_restarts` within `window` seconds."""

    max_restarts: int
    window: float
    times: tuple[float, ...] = ()

    @classmethod
    def from_policy(cls, policy: RestartPolicy) -> RestartIntensity:
        """An empty history with the policy's limits."""
        return cls(max_restarts=policy.max_restarts, window=policy.window)

    def count(self, now: float) -> int:
        """Restarts within the window that ends at `now`."""
        return sum(1 for t in self.times if now - t < self.window)

    def allows_restart(self, now: float) -> bool:
        """Whether one more restart at `now` stays within the intensity."""
        return self.count(now) < self.max_restarts

    def record(self, now: float) -> RestartIntensity:
        """This history plus a restart at `now`, forgetting restarts that left the window."""
        kept = tuple(t for t in self.times if now - t < self.window)
        return attrs.evolve(self, times=(*kept, now))


# --- session supervisor --------------------------------------------------------------------


@attrs.frozen
class SupervisorStatistics(Generic[S]):
    """A snapshot of a `SessionSupervisor`, in the style of trio's `statistics()` objects."""

    session: S | None
    """The session value of the current (or, between generations, the last) generation."""
    generation: int
    """How many generations have started, restarts included; the current one's number."""
    restarts_in_window: int
    """Restarts within the restart policy's window, as of now."""
    total_restarts: int
    """Restarts since the supervisor started."""


@attrs.frozen
class _Received(Generic[S]):
    """A session value and its arrival number, so that equal values still count as new."""

    value: S
    seq: int


def _unwrap(exc: Exception) -> Exception:
    """The lone leaf of nested one-member groups, so that logs and causes read plainly."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


class SessionSupervisor(Generic[S]):
    """Runs one generation of session-scoped services per session value, never two at once."""

    def __init__(
        self,
        sessions: trio.abc.ReceiveChannel[S],
        generation: Generation[S],
        *,
        policy: RestartPolicy | None = None,
    ) -> None:
        # The caller owns `sessions` (rule 5); closing its send side stops this supervisor.
        self._sessions = sessions
        self._generation_fn = generation
        self._policy = policy if policy is not None else RestartPolicy()
        self._intensity = RestartIntensity.from_policy(self._policy)
        self._latest: _Received[S] | None = None
        self._started_seq = 0  # arrival number of the value whose generation started last
        self._closed = False
        self._news = trio.Event()
        self._session: S | None = None
        self._generation = 0
        self._total_restarts = 0

    def statistics(self) -> SupervisorStatistics[S]:
        """The current session, generation number and restart counts."""
        return SupervisorStatistics(
            session=self._session,
            generation=self._generation,
            restarts_in_window=self._intensity.count(trio.current_time()),
            total_restarts=self._total_restarts,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Supervise generations until the channel closes; too many crashes: `SupervisorGaveUp`."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self._receive_sessions)
            task_status.started()
            crash = await self._supervise()
            nursery.cancel_scope.cancel()
        # Raised out here, not inside the nursery, so callers get it bare rather than in a group.
        if crash is not None:
            raise SupervisorGaveUp(
                f"session {self._session!r}: more than {self._policy.max_restarts} restarts"
                f" within {self._policy.window}s; last error: {crash!r}"
            ) from crash

    async def _receive_sessions(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep only the latest session value, so a burst of values converges on the last."""
        task_status.started()
        seq = 0
        async for value in self._sessions:
            seq += 1
            if self._latest is not None and self._latest.seq != self._started_seq:
                logger.debug("session %r superseded by %r", self._latest.value, value)
            self._latest = _Received(value, seq)
            self._wake()
        logger.info("session channel closed")
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        self._news.set()
        self._news = trio.Event()

    async def _wait_for_news(self, seen: int) -> None:
        """Return once a value newer than arrival `seen` is in, or the channel has closed."""
        while not self._closed and (self._latest is None or self._latest.seq == seen):
            await self._news.wait()

    async def _supervise(self) -> Exception | None:
        """The generation loop; returns the last crash if the restart intensity was exceeded."""
        seen = 0
        restart = False
        while True:
            if not restart:
                await self._wait_for_news(seen)
            latest = self._latest
            if self._closed or latest is None:
                return None
            # Read the latest value only now, after the previous generation's nursery has
            # exited: values that arrived during its cleanup are skipped, not replayed.
            seen = self._started_seq = latest.seq
            crash = await self._run_generation(latest.value)
            restart = crash is not None
            if crash is None or self._closed:
                continue
            now = trio.current_time()
            if not self._intensity.allows_restart(now):
                return crash
            self._intensity = self._intensity.record(now)
            self._total_restarts += 1
            delay = self._policy.backoff(self._intensity.count(now))
            logger.warning("restarting session %r in %.3gs", latest.value, delay)
            # A new session during the backoff starts at once; a stale restart would be wasted.
            with trio.move_on_after(delay):
                await self._wait_for_news(seen)

    async def _run_generation(self, session: S) -> Exception | None:
        """Run one generation until its nursery exits; return the crash that ended it, if any."""
        self._generation += 1
        self._session = session
        number = self._generation
        logger.info("generation %d starting (session %r)", number, session)
        watcher = trio.CancelScope()
        try:
            # Rule 3: the loop in `_supervise` cannot go on until this block has exited.
            async with trio.open_nursery() as gen:
                gen.start_soon(self._cancel_when_superseded, self._started_seq, gen, watcher)
                await gen.start(self._run_to_end, session, watcher)
                logger.info("generation %d started (session %r)", number, session)
        except Exception as exc:
            # A group holding Cancelled (or KeyboardInterrupt) is a BaseExceptionGroup, not an
            # Exception, so an outside cancellation propagates here and is never a crash.
            crash = _unwrap(exc)
            logger.error("generation %d crashed (session %r)", number, session, exc_info=crash)
            return crash
        if not gen.cancel_scope.cancel_called:
            reason = "returned; waiting for the next session"
        else:
            reason = "channel closed" if self._closed else "superseded"
        logger.info("generation %d stopped, %s (session %r)", number, reason, session)
        return None

    async def _cancel_when_superseded(
        self, seen: int, gen: trio.Nursery, watcher: trio.CancelScope
    ) -> None:
        """Cancel the generation once a newer session arrives or the channel closes."""
        with watcher:
            await self._wait_for_news(seen)
            gen.cancel_scope.cancel()

    async def _run_to_end(
        self,
        session: S,
        watcher: trio.CancelScope,
        *,
        task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run the generation function; when it returns, stop the watcher so the nursery exits."""
        await self._generation_fn(session, task_status=task_status)
        watcher.cancel()
