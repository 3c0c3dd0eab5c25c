"""The worker: runs this node's part of the cluster state.

It re-plans (`trexo.worker.plan`) on every state change and every local change, and executes
the actions as tasks of its own nursery: runner supervisors (one per runner assigned here),
task forwarders (runner chunks -> the requesting node, point-to-point), and the reporting of
facts to the master as local events. It is session-scoped: when the session ends, its
nursery exits only after every runner process it started has been reaped.
"""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import Callable
from pathlib import Path

import attrs
import psutil
import trio

from trexo import catalog
from trexo.config import (
    NODE_REPORT_INTERVAL_S,
    RUNNER_RESTART_POLICY,
    STREAM_SEND_TIMEOUT_S,
    RestartPolicy,
    RunnerConfig,
)
from trexo.errors import ClusterError, RequestRejected, RunnerDied, RunnerError
from trexo.lifecycle import RestartIntensity
from trexo.net.router import PeerUnreachable, Router
from trexo.net.topics import Topic
from trexo.types.chunks import FinishReason
from trexo.types.failure import FailureKind
from trexo.types.ids import InstanceId, NodeId, RequestId, RunnerId
from trexo.types.local_events import LocalEvent, NodeReport, RunnerReport, TaskReport
from trexo.types.runner_status import (
    TERMINAL_STATUSES,
    RunnerFailed,
    RunnerIdle,
    RunnerReady,
    RunnerRunning,
    RunnerStatus,
)
from trexo.types.session import Session
from trexo.types.state import Instance, NodeInfo, RunnerAssignment, State, Task
from trexo.types.stream import StreamChunk, StreamFailed
from trexo.worker.plan import (
    CancelTask,
    ForwardTask,
    LocalWorld,
    StartRunner,
    StopRunner,
    plan,
)
from trexo.worker.runner_supervisor import RunnerSupervisor
from trexo.worker.state_view import StateView

log = logging.getLogger(__name__)


def read_node_info(node_id: NodeId, api_url: str | None) -> NodeInfo:
    memory = psutil.virtual_memory()
    return NodeInfo(node_id, socket.gethostname(), memory.total, memory.available, api_url)


def failure_kind(exc: Exception) -> FailureKind:
    """How the API should answer a task that failed with `exc`."""
    if isinstance(exc, RequestRejected):
        return FailureKind.INVALID_REQUEST
    if isinstance(exc, RunnerDied):
        return FailureKind.UNAVAILABLE  # its restart is on the way: retry shortly
    return FailureKind.INTERNAL


@attrs.define
class _LocalRunner:
    supervisor: RunnerSupervisor
    instance_id: InstanceId
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    status: RunnerStatus = RunnerIdle()
    """What was last reported of it (its supervisor's status, or the pending restart)."""


class Worker:
    def __init__(
        self,
        *,
        router: Router,
        session: Session,
        view: StateView,
        models_dir: Path,
        runner_logs_dir: Path,
        runner_config: RunnerConfig = RunnerConfig(),
        runner_env: dict[str, str] | None = None,
        api_url: Callable[[], str | None] = lambda: None,
        restart_policy: RestartPolicy = RUNNER_RESTART_POLICY,
        node_report_interval: float = NODE_REPORT_INTERVAL_S,
    ) -> None:
        self._router = router
        self.node_id = router.node_id
        self._session = session
        self._view = view
        self._models_dir = models_dir
        self._runner_logs_dir = runner_logs_dir
        self._runner_config = runner_config
        self._runner_env = runner_env or {}
        self._api_url = api_url
        self._restart_policy = restart_policy
        self._node_report_interval = node_report_interval
        self._runners: dict[RunnerId, _LocalRunner] = {}
        self._failures: dict[InstanceId, RestartIntensity] = {}
        """Recent runner deaths per instance: they set the next restart's backoff."""
        self._taken: set[RequestId] = set()
        self._inflight: dict[RequestId, RunnerSupervisor] = {}
        """Tasks being forwarded now, and the runner each runs on."""
        self._cancelling: set[RequestId] = set()
        self._local_changed = trio.Event()
        self._reports_send, self._reports_receive = trio.open_memory_channel[LocalEvent](math.inf)

    @property
    def runners(self) -> dict[RunnerId, RunnerSupervisor]:
        """The runner supervisors alive on this node now."""
        return {rid: entry.supervisor for rid, entry in self._runners.items()}

    async def run(self, *, task_status: trio.TaskStatus[Worker] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._send_reports)
            nursery.start_soon(self._report_node_periodically)
            nursery.start_soon(self._wake_on_state_changes)
            task_status.started(self)
            await self._plan_loop(nursery)

    # --- planning -------------------------------------------------------------------------

    def _local_world(self) -> LocalWorld:
        return LocalWorld(
            node_id=self.node_id,
            runners=frozenset(self._runners),
            taken=frozenset(self._taken),
            inflight=frozenset(self._inflight),
            cancelling=frozenset(self._cancelling),
        )

    def _changed(self) -> None:
        self._local_changed.set()

    async def _wake_on_state_changes(self) -> None:
        index = self._view.state.last_index
        while True:
            state = await self._view.wait_state_change(index)
            index = state.last_index
            self._changed()

    async def _plan_loop(self, nursery: trio.Nursery) -> None:
        while True:
            self._local_changed = trio.Event()
            state = self._view.state
            self._forget_ended_tasks(state)
            for action in plan(state, self._local_world()):
                self._execute(action, nursery)
            await self._local_changed.wait()

    def _forget_ended_tasks(self, state: State) -> None:
        self._taken -= self._taken - state.tasks.keys() - self._inflight.keys()
        self._cancelling &= self._inflight.keys()

    def _execute(self, action: object, nursery: trio.Nursery) -> None:
        match action:
            case StartRunner(instance=instance, assignment=assignment):
                self._start_runner(instance, assignment, nursery)
            case StopRunner(runner_id=runner_id):
                log.info("stopping runner %s: its instance is gone", runner_id)
                self._runners[runner_id].scope.cancel()
            case ForwardTask(task=task, runner_id=runner_id):
                self._taken.add(task.task_id)
                supervisor = self._runners[runner_id].supervisor
                self._inflight[task.task_id] = supervisor
                nursery.start_soon(self._forward, task, supervisor)
            case CancelTask(task_id=task_id):
                self._cancelling.add(task_id)
                nursery.start_soon(self._cancel, task_id)

    # --- runners --------------------------------------------------------------------------

    def _start_runner(
        self, instance: Instance, assignment: RunnerAssignment, nursery: trio.Nursery
    ) -> None:
        runner_id = assignment.runner_id

        def on_status(status: RunnerStatus) -> None:
            self._set_runner_status(entry, status)

        supervisor = RunnerSupervisor(
            runner_id,
            config=self._runner_config,
            log_dir=self._runner_logs_dir,
            env=self._runner_env,
            on_status=on_status,
        )
        entry = _LocalRunner(supervisor, instance.instance_id)
        self._runners[runner_id] = entry
        nursery.start_soon(self._run_runner, instance, assignment, entry)

    def _set_runner_status(self, entry: _LocalRunner, status: RunnerStatus) -> None:
        entry.status = status
        self._report(RunnerReport(entry.supervisor.runner_id, entry.instance_id, status))
        self._changed()

    async def _run_runner(
        self, instance: Instance, assignment: RunnerAssignment, entry: _LocalRunner
    ) -> None:
        supervisor = entry.supervisor
        try:
            with entry.scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(supervisor.run)
                    try:
                        model_dir = await trio.to_thread.run_sync(
                            catalog.model_dir, instance.model, self._models_dir
                        )
                        await supervisor.load(model_dir, assignment.shard)
                    # OSError: the model directory could not be read (no descriptor left, ...)
                    except (RunnerError, ClusterError, OSError) as exc:
                        log.error(
                            "runner %s could not load %s: %s",
                            supervisor.runner_id,
                            instance.model.model_id,
                            exc,
                        )
                        nursery.cancel_scope.cancel()
                if supervisor.exit_cause is not None and not entry.scope.cancel_called:
                    await self._wait_to_restart(entry)  # then the plan starts it again
        finally:
            del self._runners[assignment.runner_id]
            self._changed()

    async def _wait_to_restart(self, entry: _LocalRunner) -> None:
        """Back off before the runner that just died is started again (its restart policy)."""
        now = trio.current_time()
        policy = self._restart_policy
        history = self._failures.get(
            entry.instance_id, RestartIntensity(policy.max_restarts, policy.window)
        ).record(now)
        self._failures[entry.instance_id] = history
        delay = policy.restart_delay(history.count(now))
        status = entry.supervisor.status
        cause = status.cause if isinstance(status, RunnerFailed) else entry.supervisor.exit_cause
        log.warning(
            "runner %s failed (%s), %d time(s) in %.0f s; restarting in %.1f s",
            entry.supervisor.runner_id,
            cause,
            history.count(now),
            policy.window,
            delay,
        )
        self._set_runner_status(entry, RunnerFailed(str(cause), restart_in=delay))
        await trio.sleep(delay)

    # --- tasks ----------------------------------------------------------------------------

    async def _forward(self, task: Task, supervisor: RunnerSupervisor) -> None:
        """Run `task` on the local lead runner; stream chunks to the requesting node."""
        reason: FinishReason = "error"
        try:
            status = await supervisor.wait_status(
                lambda s: isinstance(s, RunnerReady | RunnerRunning)
            )
            if isinstance(status, TERMINAL_STATUSES):
                raise RunnerDied(f"runner {supervisor.runner_id} is down: {status}")
            self._report(TaskReport(task.task_id, "running"))
            async with supervisor.open_generation(task.request) as stream:
                async for chunk in stream:
                    with trio.fail_after(STREAM_SEND_TIMEOUT_S):
                        await self._router.send(task.origin_node, Topic.STREAM, StreamChunk(chunk))
                    if chunk.finish_reason is not None:
                        reason = chunk.finish_reason
        except (RunnerError, trio.TooSlowError) as exc:
            log.warning("task %s failed: %s", task.task_id, exc)
            kind = failure_kind(exc)
            message = str(exc)
            if kind is FailureKind.UNAVAILABLE:
                message = f"{exc}; its runner is being restarted, retry shortly"
            await self._tell_origin(task, StreamFailed(task.task_id, message, kind))
        except PeerUnreachable:
            log.info("task %s: its requesting node is gone; cancelled", task.task_id)
            reason = "cancelled"
        finally:
            self._inflight.pop(task.task_id, None)
            self._report(TaskReport(task.task_id, finish_reason=reason))
            self._changed()

    async def _cancel(self, task_id: RequestId) -> None:
        """Tell the runner forwarding `task_id` to stop it; its stream then ends "cancelled"."""
        supervisor = self._inflight.get(task_id)
        if supervisor is not None:
            await supervisor.cancel(task_id)

    async def _tell_origin(self, task: Task, item: StreamFailed) -> None:
        try:
            with trio.move_on_after(STREAM_SEND_TIMEOUT_S):
                await self._router.send(task.origin_node, Topic.STREAM, item)
        except PeerUnreachable:
            log.info("task %s: requesting node gone", task.task_id)

    # --- reports to the master ------------------------------------------------------------

    def _report(self, event: LocalEvent) -> None:
        self._reports_send.send_nowait(event)

    async def _send_reports(self) -> None:
        async for event in self._reports_receive:
            try:
                await self._router.send(self._session.master_id, Topic.LOCAL_EVENTS, event)
            except PeerUnreachable:
                log.debug("master unreachable; dropped %s", type(event).__name__)

    async def _report_node_periodically(self) -> None:
        """Report this node's memory and its runners' statuses, again every interval.

        Repeats cost nothing (the master emits events only for changes) and repair a report
        lost in transit, e.g. on a link that was replaced while two nodes first met.
        """
        while True:
            try:
                info = await trio.to_thread.run_sync(read_node_info, self.node_id, self._api_url())
            except OSError as exc:  # e.g. EMFILE: no descriptor left to read /proc/meminfo
                log.warning(
                    "could not read this node's memory figures (%s); trying again in %g s",
                    exc,
                    self._node_report_interval,
                )
            else:
                self._report(NodeReport(info))
            for runner_id, entry in self._runners.items():
                self._report(RunnerReport(runner_id, entry.instance_id, entry.status))
            await trio.sleep(self._node_report_interval)
