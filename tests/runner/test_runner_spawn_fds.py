"""A runner that cannot be spawned for lack of file descriptors is a failed runner, with
its cause in the status, not an exception that would end its owner's generation."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from fd_exhaustion import exhausted_fds

from trexo.errors import RunnerError
from trexo.types.runner_status import RunnerFailed, RunnerReady, RunnerStatus
from trexo.worker.runner_supervisor import RunnerSupervisor

from .helpers import FAST_STOP, TEST_TIMEOUT_S


@pytest.mark.parametrize(
    "spare",
    [
        pytest.param(0, id="no-socketpair"),
        pytest.param(2, id="socketpair-but-no-pipes"),  # the spawn itself fails
    ],
)
async def test_spawn_without_descriptors_is_a_runner_failure(tmp_path: Path, spare: int) -> None:
    statuses: list[RunnerStatus] = []
    supervisor = RunnerSupervisor(
        "fd-starved", config=FAST_STOP, log_dir=tmp_path, on_status=statuses.append
    )
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            with exhausted_fds(spare=spare):
                await nursery.start(supervisor.run)
        # `run` has returned: there is no process to reap.
    assert supervisor.pid is None
    [status] = statuses
    assert isinstance(status, RunnerFailed)
    assert "could not start" in status.cause and "Too many open files" in status.cause
    assert supervisor.exit_cause == status.cause
    with pytest.raises(RunnerError):
        await supervisor.load(tmp_path / "model")


async def test_a_runner_starts_once_descriptors_are_back(tmp_path: Path, tiny_model: Path) -> None:
    """The failure is not sticky: the next supervisor (the worker's retry) gets a runner
    that serves (it loads a model; a runner still importing at its stop would be stopped
    by the ladder's SIGTERM, on a slow machine, not by its answer to `Shutdown`)."""
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            with exhausted_fds():
                await nursery.start(RunnerSupervisor("fd-starved", config=FAST_STOP).run)
            supervisor = RunnerSupervisor("retried", config=FAST_STOP, log_dir=tmp_path)
            await nursery.start(supervisor.run)
            assert supervisor.pid is not None
            await supervisor.load(tiny_model)
            assert supervisor.status == RunnerReady()
            nursery.cancel_scope.cancel()
    assert supervisor.stop_step == "shutdown"
