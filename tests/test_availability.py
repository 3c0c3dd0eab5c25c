"""Whether a placed model can serve now, and why not."""

from __future__ import annotations

import attrs

from trexo.availability import instance_availability, model_availability, problems
from trexo.state import apply_all
from trexo.types.downloads import DownloadPhase, DownloadProgress
from trexo.types.events import DownloadUpdated, InstanceCreated, NodeUpdated, RunnerStatusChanged
from trexo.types.ids import InstanceId, NodeId, RunnerId
from trexo.types.models import ModelRef
from trexo.types.runner_status import (
    RunnerDownloading,
    RunnerFailed,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerStatus,
)
from trexo.types.state import Instance, NodeInfo, RunnerAssignment, State

MiB = 1024 * 1024
MODEL = ModelRef("m", "demo:tiny", 1)
NODE = NodeId("node-a")


def instance(name: str) -> Instance:
    return Instance(InstanceId(name), MODEL, (RunnerAssignment(RunnerId(f"r-{name}"), NODE),))


def with_status(state: State, inst: Instance, status: RunnerStatus) -> State:
    runner = inst.assignments[0].runner_id
    return apply_all(state, [RunnerStatusChanged(runner, inst.instance_id, NODE, status)])


def test_an_unplaced_model_has_no_availability() -> None:
    assert model_availability(State(), "m") is None


def test_ready_or_running_serves_anything_else_says_why() -> None:
    one = instance("one")
    state = apply_all(State(), [InstanceCreated(one)])
    assert "is starting" in instance_availability(state, one).reason
    for status in (RunnerReady(), RunnerRunning(2)):
        assert instance_availability(with_status(state, one, status), one).serving
    loading = instance_availability(with_status(state, one, RunnerLoading(0.42)), one)
    assert not loading.serving and "loading the model (42%)" in loading.reason
    failed = instance_availability(
        with_status(state, one, RunnerFailed("SIGKILL", restart_in=4.0)), one
    )
    assert not failed.serving
    assert "SIGKILL" in failed.reason and "restarting in 4.0 s" in failed.reason
    assert failed.retry_after == 4.0


def test_a_model_serves_if_any_instance_does_and_problems_name_the_others() -> None:
    one, two = instance("one"), instance("two")
    state = apply_all(State(), [InstanceCreated(one), InstanceCreated(two)])
    state = with_status(state, one, RunnerFailed("exit code 1"))
    down = model_availability(state, "m")
    assert down is not None and not down.serving and "model m cannot serve" in down.reason
    state = with_status(state, two, RunnerReady())
    up = model_availability(state, "m")
    assert up is not None and up.serving
    (problem,) = problems(state)
    assert problem.startswith("instance one (m)") and "exit code 1" in problem


def test_a_runner_waiting_for_a_download_says_how_far_it_is() -> None:
    one = instance("one")
    state = with_status(
        apply_all(State(), [NodeUpdated(NodeInfo(NODE, "a", 1, 1)), InstanceCreated(one)]),
        one,
        RunnerDownloading(),
    )
    waiting = instance_availability(state, one)
    assert not waiting.serving and "waiting for its node to download" in waiting.reason
    progress = DownloadProgress(
        "m", DownloadPhase.DOWNLOADING, 41 * MiB, 100 * MiB, 2.5 * MiB, eta_s=23.6
    )
    state = apply_all(state, [DownloadUpdated(NODE, progress)])
    assert instance_availability(state, one).reason.endswith(
        "is downloading the model (41% of 100.0 MiB, 2.5 MiB/s, about 24 s left)"
    )
    retrying = attrs.evolve(
        progress, phase=DownloadPhase.RETRYING, error="cannot reach the hub", retry_in=4.0
    )
    state = apply_all(state, [DownloadUpdated(NODE, retrying)])
    assert "retrying in 4 s after: cannot reach the hub" in instance_availability(state, one).reason


def test_a_runner_failed_for_good_says_so_and_is_not_worth_a_retry() -> None:
    one, two = instance("one"), instance("two")
    state = apply_all(State(), [InstanceCreated(one), InstanceCreated(two)])
    broken = RunnerFailed("load failed: ValueError: shapes differ", permanent=True)
    state = with_status(state, one, broken)
    reason = instance_availability(state, one)
    assert reason.for_good and "shapes differ" in reason.reason
    assert "not retried" in reason.reason and "delete the instance" in reason.reason
    # Another instance still loading: the model is worth a retry, and says when.
    state = with_status(state, two, RunnerFailed("SIGKILL", restart_in=3.0))
    mixed = model_availability(state, "m")
    assert mixed is not None and not mixed.for_good and mixed.retry_after == 3.0
    # Every instance failed for good: not worth one.
    state = with_status(state, two, broken)
    gone = model_availability(state, "m")
    assert gone is not None and gone.for_good and "shapes differ" in gone.reason
