"""Whether an instance can serve now, and if not, why and when to retry. Pure functions.

The API answers a model that is placed but not serving with 503 + `Retry-After` and this
reason; `/health` lists the reasons as the node's problems; `/v1/models` says `ready`.
"""

from __future__ import annotations

from typing import Literal

import attrs

from trexo.config import API_RETRY_AFTER_S
from trexo.types.downloads import DownloadPhase, DownloadProgress
from trexo.types.runner_status import (
    RunnerDownloading,
    RunnerFailed,
    RunnerIdle,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerStopped,
)
from trexo.types.session import Session
from trexo.types.state import Instance, State
from trexo.units import format_bytes


@attrs.frozen
class Availability:
    serving: bool
    reason: str = ""
    """Why it is not serving (empty when it is)."""
    retry_after: float = API_RETRY_AFTER_S
    for_good: bool = False
    """It will not serve without the operator: a runner failed for good (a retry is futile)."""


SERVING = Availability(True)


def instance_availability(state: State, instance: Instance) -> Availability:
    """Serving when every runner of `instance` is ready or running; else the first reason."""
    for assignment in sorted(instance.assignments, key=lambda a: a.shard.rank):
        record = state.runners.get(assignment.runner_id)
        status = record.status if record is not None else RunnerIdle()
        runner = f"runner {assignment.runner_id[:8]} on node {assignment.node_id[:8]}"
        match status:
            case RunnerReady() | RunnerRunning():
                continue
            case RunnerIdle():
                return Availability(False, f"{runner} is starting")
            case RunnerDownloading():
                download = state.downloads.get(assignment.node_id, {}).get(instance.model.model_id)
                return Availability(False, f"{runner} is {downloading(download)}")
            case RunnerLoading(progress=progress):
                return Availability(False, f"{runner} is loading the model ({progress:.0%})")
            case RunnerFailed(cause=cause, permanent=True):
                return Availability(
                    False,
                    f"{runner} cannot load the model ({cause}); it is not retried: delete the "
                    "instance and place the model differently",
                    for_good=True,
                )
            case RunnerFailed(cause=cause, restart_in=restart_in):
                if restart_in is None:
                    return Availability(False, f"{runner} failed ({cause})")
                return Availability(
                    False,
                    f"{runner} failed ({cause}); restarting in {restart_in:.1f} s",
                    max(API_RETRY_AFTER_S, restart_in),
                )
            case RunnerStopped(cause=cause):
                return Availability(False, f"{runner} was stopped ({cause})")
    return SERVING


def downloading(download: DownloadProgress | None) -> str:
    """What a runner waiting for its node's download of the model is waiting for."""
    if download is None or download.total_bytes <= 0:
        return "waiting for its node to download the model"
    if download.phase is DownloadPhase.FAILED:
        return f"waiting for a download that failed ({download.error})"
    return f"downloading the model ({describe_download(download)})"


def describe_download(progress: DownloadProgress) -> str:
    """`45% of 80.0 MiB, 12.0 MiB/s, about 4 s left`, or why it is waiting."""
    if progress.phase is DownloadPhase.RETRYING:
        return f"retrying in {progress.retry_in or 0:.0f} s after: {progress.error}"
    text = f"{progress.fraction:.0%} of {format_bytes(progress.total_bytes)}"
    if progress.bytes_per_s > 0:
        text += f", {format_bytes(int(progress.bytes_per_s))}/s"
    if progress.eta_s is not None and progress.phase is DownloadPhase.DOWNLOADING:
        text += f", about {progress.eta_s:.0f} s left"
    return text


def model_availability(state: State, model_id: str) -> Availability | None:
    """Serving if any instance of `model_id` is; None if the model is not placed at all."""
    instances = [i for i in state.instances.values() if i.model.model_id == model_id]
    if not instances:
        return None
    found = [instance_availability(state, i) for i in instances]
    if any(a.serving for a in found):
        return SERVING
    if all(a.for_good for a in found):
        reason = f"model {model_id} cannot serve: {found[0].reason}"
        return Availability(False, reason, for_good=True)
    soonest = min((a for a in found if not a.for_good), key=lambda a: a.retry_after)
    reason = f"model {model_id} cannot serve right now: {soonest.reason}"
    return Availability(False, reason, soonest.retry_after)


def failed_for_good(state: State, instance: Instance) -> bool:
    """Whether a runner of `instance` failed in a way no restart mends."""
    return any(
        isinstance(record.status, RunnerFailed) and record.status.permanent
        for a in instance.assignments
        if (record := state.runners.get(a.runner_id)) is not None
    )


def problems(state: State) -> list[str]:
    """Every placed instance that cannot serve now, with why (for `/health`)."""
    found = []
    for instance in sorted(state.instances.values(), key=lambda i: i.instance_id):
        availability = instance_availability(state, instance)
        if not availability.serving:
            found.append(
                f"instance {instance.instance_id[:8]} ({instance.model.model_id}): "
                f"{availability.reason}"
            )
    return found


ClusterStatus = Literal["ok", "electing", "degraded"]


def cluster_status(session: Session | None, found_problems: list[str]) -> ClusterStatus:
    """A node's one-word summary (`/health`, `/state/events`): electing while it knows no
    session, degraded while some instance cannot serve (`problems`), else ok."""
    if session is None:
        return "electing"
    return "degraded" if found_problems else "ok"
