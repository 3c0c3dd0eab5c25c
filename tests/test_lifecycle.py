"""SessionSupervisor: generations never overlap, crashes restart with bounded backoff."""

from __future__ import annotations

import itertools
import logging
import math
import traceback
from typing import Any

import attrs
import hypothesis.strategies as st
import pytest
import trio
import trio.testing
from hypothesis import given, settings

from trexo.config import RestartPolicy
from trexo.errors import SupervisorGaveUp
from trexo.lifecycle import RestartIntensity, Service, SessionSupervisor

CLEANUP_S = 5.0
"""How long the slow task's shielded cleanup takes, in virtual seconds."""


class Boom(Exception):
    """The crash our generations raise."""


class Fatal(BaseException):
    """Stands in for KeyboardInterrupt, which pytest would take as the user's Ctrl-C."""


@attrs.frozen
class Mark:
    """One timeline entry: when a task of a session's generation entered or exited."""

    at: float
    event: str
    session: int
    task: str


@attrs.define
class Timeline:
    """Enter/exit marks of generation tasks, with a live count to catch overlaps as they happen."""

    marks: list[Mark] = attrs.Factory(list)
    live: int = 0
    most_live: int = 0

    def enter(self, session: int, task: str) -> None:
        self.marks.append(Mark(trio.current_time(), "enter", session, task))
        self.live += 1
        self.most_live = max(self.most_live, self.live)

    def exit(self, session: int, task: str) -> None:
        self.marks.append(Mark(trio.current_time(), "exit", session, task))
        self.live -= 1

    def of(self, session: int, event: str) -> list[Mark]:
        return [m for m in self.marks if m.session == session and m.event == event]


def two_task_generation(timeline: Timeline, cleanup: float = CLEANUP_S) -> Any:
    """A generation of a plain task and a task whose shielded cleanup takes `cleanup` s."""

    async def plain(session: int) -> None:
        timeline.enter(session, "plain")
        try:
            await trio.sleep_forever()
        finally:
            timeline.exit(session, "plain")

    async def slow_cleanup(session: int) -> None:
        timeline.enter(session, "slow")
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(cleanup)
            timeline.exit(session, "slow")

    async def generation(
        session: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(plain, session)
            nursery.start_soon(slow_cleanup, session)
            task_status.started()

    return generation


def crashing_generation(
    starts: list[float], *, run_for: float = 0.0, before_started: bool = False
) -> Any:
    """A generation that records its start time and raises `Boom` after `run_for` s."""

    async def generation(
        session: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        starts.append(trio.current_time())
        if not before_started:
            task_status.started()
        await trio.sleep(run_for)
        raise Boom(len(starts))

    return generation


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def test_supervisor_is_a_service() -> None:
    service: Service = SessionSupervisor(
        trio.open_memory_channel[int](0)[1], two_task_generation(Timeline())
    )
    assert callable(service.run)


# --- restart intensity (pure) ----------------------------------------------------------------


def test_intensity_counts_only_restarts_inside_the_window() -> None:
    intensity = RestartIntensity(max_restarts=2, window=10.0)
    assert intensity.allows_restart(0.0)
    intensity = intensity.record(0.0).record(4.0)
    assert intensity.count(9.9) == 2
    assert not intensity.allows_restart(9.9)
    # A restart exactly `window` ago has left it.
    assert intensity.count(10.0) == 1
    assert intensity.allows_restart(10.0)
    assert intensity.record(15.0).times == (15.0,)


@given(
    times=st.lists(st.floats(0, 100, allow_nan=False), max_size=20).map(sorted),
    window=st.floats(0.1, 50, allow_nan=False),
)
def test_intensity_matches_a_brute_force_count(times: list[float], window: float) -> None:
    intensity = RestartIntensity(max_restarts=3, window=window)
    for i, t in enumerate(times):
        intensity = intensity.record(t)
        assert intensity.count(t) == sum(1 for s in times[: i + 1] if t - s < window)
        assert intensity.allows_restart(t) == (intensity.count(t) < 3)


# --- generations never overlap ---------------------------------------------------------------


async def test_next_generation_waits_for_every_task_of_the_previous(
    autojump_clock: trio.testing.MockClock,
) -> None:
    timeline = Timeline()
    send, receive = trio.open_memory_channel[int](math.inf)
    supervisor = SessionSupervisor(receive, two_task_generation(timeline))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        send.send_nowait(1)
        await trio.sleep(1)
        swap_at = trio.current_time()
        send.send_nowait(2)
        await trio.sleep(CLEANUP_S + 1)
        assert supervisor.statistics().session == 2
        assert supervisor.statistics().generation == 2
        await send.aclose()

    assert timeline.most_live == 2  # both tasks of one generation, never three or four
    last_exit_1 = max(m.at for m in timeline.of(1, "exit"))
    first_enter_2 = min(m.at for m in timeline.of(2, "enter"))
    assert last_exit_1 == swap_at + CLEANUP_S
    assert first_enter_2 >= last_exit_1
    # The timeline order says the same without clocks: all of 1 ends before any of 2 begins.
    sessions = [m.session for m in timeline.marks]
    assert sessions == sorted(sessions)
    assert {(m.task, m.event) for m in timeline.of(2, "exit")} == {
        ("plain", "exit"),
        ("slow", "exit"),
    }


async def test_restart_waits_for_the_crashed_generations_cleanup(
    autojump_clock: trio.testing.MockClock,
) -> None:
    timeline = Timeline()
    policy = RestartPolicy(backoff_initial=0.5)

    async def generation(
        session: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(two_task_generation(timeline), session)
            task_status.started()
            await trio.sleep(1)
            raise Boom

    send, receive = trio.open_memory_channel[int](math.inf)
    send.send_nowait(7)
    with trio.move_on_after(1 + CLEANUP_S + 0.5 + 0.25):
        await SessionSupervisor(receive, generation, policy=policy).run()
    restart_at = 1 + CLEANUP_S + policy.backoff(1)
    cancel_at = restart_at + 0.25
    assert sorted((m.at, m.event) for m in timeline.marks) == [
        (0.0, "enter"),
        (0.0, "enter"),
        (1.0, "exit"),  # the crash cancels the plain task at once...
        (1 + CLEANUP_S, "exit"),  # ...and the slow one finishes its cleanup
        (restart_at, "enter"),  # only then, plus the backoff, does the restart begin
        (restart_at, "enter"),
        (cancel_at, "exit"),
        (cancel_at + CLEANUP_S, "exit"),
    ]
    assert timeline.most_live == 2


# --- restarts ------------------------------------------------------------------------------


@pytest.mark.parametrize("before_started", [False, True])
async def test_crash_restarts_with_backoff_then_gives_up(
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    before_started: bool,
) -> None:
    policy = RestartPolicy(
        max_restarts=3, window=100.0, backoff_initial=1.0, backoff_factor=2.0, backoff_max=3.0
    )
    starts: list[float] = []
    send, receive = trio.open_memory_channel[int](math.inf)
    send.send_nowait(1)
    supervisor = SessionSupervisor(
        receive, crashing_generation(starts, before_started=before_started), policy=policy
    )
    with (
        caplog.at_level(logging.INFO, logger="trexo.lifecycle"),
        pytest.raises(SupervisorGaveUp) as info,
    ):
        await supervisor.run()

    assert gaps(starts) == [policy.backoff(1), policy.backoff(2), policy.backoff(3)]
    assert gaps(starts) == [1.0, 2.0, 3.0]
    cause = info.value.__cause__
    assert isinstance(cause, Boom)
    assert cause.args == (4,)  # the last crash, unwrapped from trio's exception groups
    assert "generation" in [frame.name for frame in traceback.extract_tb(cause.__traceback__)]
    crashes = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(crashes) == 4
    assert all(r.exc_info and isinstance(r.exc_info[1], Boom) for r in crashes)
    stats = supervisor.statistics()
    assert (stats.session, stats.generation, stats.total_restarts) == (1, 4, 3)
    assert stats.restarts_in_window == 3


async def test_restarts_spread_beyond_the_window_do_not_accumulate(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = RestartPolicy(max_restarts=2, window=10.0, backoff_initial=1.0, backoff_max=8.0)
    starts: list[float] = []
    send, receive = trio.open_memory_channel[int](math.inf)
    send.send_nowait(1)
    supervisor = SessionSupervisor(
        receive, crashing_generation(starts, run_for=policy.window), policy=policy
    )
    crashes = 8  # four times the intensity
    # Cancel halfway through the last generation, before it crashes.
    with trio.move_on_after((crashes - 1) * (policy.window + 1) + policy.window / 2):
        await supervisor.run()
    assert len(starts) == crashes
    assert gaps(starts) == [policy.window + policy.backoff(1)] * (crashes - 1)
    stats = supervisor.statistics()
    assert (stats.total_restarts, stats.restarts_in_window) == (crashes - 1, 1)


async def test_new_session_during_backoff_starts_promptly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = RestartPolicy(backoff_initial=5.0)
    started: list[tuple[float, int]] = []

    async def generation(
        session: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        started.append((trio.current_time(), session))
        task_status.started()
        if session == 1:
            raise Boom
        await trio.sleep_forever()

    send, receive = trio.open_memory_channel[int](math.inf)
    supervisor = SessionSupervisor(receive, generation, policy=policy)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        send.send_nowait(1)
        await trio.sleep(1)
        send.send_nowait(2)
        await trio.sleep(10)
        await send.aclose()
    assert started == [(0.0, 1), (1.0, 2)]
    assert supervisor.statistics().total_restarts == 1


async def test_a_generation_that_returns_waits_for_the_next_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    started: list[tuple[float, int]] = []

    async def generation(
        session: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        started.append((trio.current_time(), session))
        task_status.started()

    send, receive = trio.open_memory_channel[int](math.inf)
    supervisor = SessionSupervisor(receive, generation)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        send.send_nowait(1)
        await trio.sleep(100)
        send.send_nowait(1)  # the same value again is a new session all the same
        await trio.sleep(1)
        await send.aclose()
    assert started == [(0.0, 1), (100.0, 1)]
    assert supervisor.statistics().total_restarts == 0


async def test_non_exception_propagates_without_restart(
    autojump_clock: trio.testing.MockClock,
) -> None:
    starts = 0

    async def generation(
        session: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        nonlocal starts
        starts += 1
        task_status.started()
        raise Fatal

    send, receive = trio.open_memory_channel[int](math.inf)
    send.send_nowait(1)
    supervisor = SessionSupervisor(receive, generation)
    with pytest.RaisesGroup(Fatal, flatten_subgroups=True):
        await supervisor.run()
    assert starts == 1
    assert supervisor.statistics().total_restarts == 0


# --- stopping ------------------------------------------------------------------------------


async def test_cancelling_the_supervisor_stops_the_generation_and_returns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    timeline = Timeline()
    send, receive = trio.open_memory_channel[int](math.inf)
    send.send_nowait(1)
    supervisor = SessionSupervisor(receive, two_task_generation(timeline))
    with trio.move_on_after(3) as scope:
        await supervisor.run()
    assert scope.cancelled_caught
    # `run` returned only after the shielded cleanup had finished.
    assert trio.current_time() == 3 + CLEANUP_S
    assert timeline.live == 0
    assert [(m.event, m.task) for m in timeline.marks if m.event == "exit"] == [
        ("exit", "plain"),
        ("exit", "slow"),
    ]
    assert supervisor.statistics().total_restarts == 0  # Cancelled is not a crash


async def test_cancelling_during_backoff_returns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    starts: list[float] = []
    send, receive = trio.open_memory_channel[int](math.inf)
    send.send_nowait(1)
    policy = RestartPolicy(backoff_initial=10.0)
    with trio.move_on_after(3) as scope:
        await SessionSupervisor(receive, crashing_generation(starts), policy=policy).run()
    assert scope.cancelled_caught
    assert starts == [0.0]
    assert trio.current_time() == 3


async def test_channel_close_ends_the_supervisor_cleanly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    timeline = Timeline()
    send, receive = trio.open_memory_channel[int](0)
    supervisor = SessionSupervisor(receive, two_task_generation(timeline))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await send.send(1)  # unbuffered: the supervisor is listening once started
        await trio.sleep(1)
        await send.aclose()
        closed_at = trio.current_time()
    # The nursery exited because `run` returned normally, after the generation's cleanup.
    assert trio.current_time() == closed_at + CLEANUP_S
    assert timeline.live == 0
    assert len(timeline.of(1, "exit")) == 2


async def test_channel_close_before_any_session_and_during_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    send, receive = trio.open_memory_channel[int](math.inf)
    send.close()
    await SessionSupervisor(receive, crashing_generation([])).run()
    assert trio.current_time() == 0

    starts: list[float] = []
    send, receive = trio.open_memory_channel[int](math.inf)
    supervisor = SessionSupervisor(
        receive, crashing_generation(starts), policy=RestartPolicy(backoff_initial=10.0)
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        send.send_nowait(1)
        await trio.sleep(2)
        await send.aclose()
    assert starts == [0.0]
    assert trio.current_time() == 2  # returned at the close, not after the backoff


# --- bursts converge on the latest ---------------------------------------------------------


@attrs.frozen
class Arrival:
    """A session value sent `after` seconds; its generation takes `startup` s to be ready."""

    after: float
    startup: float
    cleanup: float


DELAYS = st.sampled_from([0.0, 0.0, 0.25, 1.0, 2.0])

ARRIVALS = st.lists(
    st.builds(Arrival, after=DELAYS, startup=DELAYS, cleanup=DELAYS), min_size=1, max_size=10
)


async def burst_scenario(arrivals: list[Arrival]) -> None:
    """Send the arrivals, then close; check every generation as it starts, and the end."""
    sent: list[tuple[float, int]] = []
    started: list[tuple[float, int]] = []
    # Collected rather than asserted in the generation: the supervisor would take an
    # AssertionError there for a crash and restart.
    violations: list[str] = []
    live = 0

    async def generation(
        session: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        nonlocal live
        now = trio.current_time()
        started.append((now, session))
        # Never start a value that something already sent (at an earlier instant) superseded.
        if [w for t, w in sent if t < now and w > session]:
            violations.append(f"started stale {session} at {now}")
        live += 1
        if live != 1:
            violations.append(f"{live} generations at once")
        try:
            await trio.sleep(arrivals[session].startup)
            task_status.started()
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(arrivals[session].cleanup)
            live -= 1

    send, receive = trio.open_memory_channel[int](math.inf)
    supervisor = SessionSupervisor(receive, generation)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        for session, arrival in enumerate(arrivals):
            await trio.sleep(arrival.after)
            sent.append((trio.current_time(), session))
            send.send_nowait(session)
        last_sent_at = trio.current_time()
        await trio.sleep(10)  # longer than any cleanup plus startup
        last = len(arrivals) - 1
        assert started[-1][1] == last
        assert started[-1][0] <= last_sent_at + max(a.cleanup for a in arrivals)
        assert supervisor.statistics().session == last
        await send.aclose()

    assert violations == []
    assert live == 0
    values = [s for _, s in started]
    assert values == sorted(set(values)), "a value started twice or out of order"
    stats = supervisor.statistics()
    assert (stats.generation, stats.total_restarts) == (len(started), 0)


@settings(max_examples=60, deadline=None)
@given(arrivals=ARRIVALS)
def test_many_sessions_converge_on_the_latest(arrivals: list[Arrival]) -> None:
    trio.run(burst_scenario, arrivals, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_a_burst_during_cleanup_starts_only_the_last(
    autojump_clock: trio.testing.MockClock,
) -> None:
    timeline = Timeline()
    send, receive = trio.open_memory_channel[int](math.inf)
    supervisor = SessionSupervisor(receive, two_task_generation(timeline))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        send.send_nowait(0)
        await trio.sleep(1)
        for session in range(1, 6):
            send.send_nowait(session)
            await trio.sleep(0.5)
        await trio.sleep(CLEANUP_S)
        await send.aclose()
    assert sorted({m.session for m in timeline.marks}) == [0, 5]
    assert supervisor.statistics().generation == 2
