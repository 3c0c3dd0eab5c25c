"""The node's runners and the tasks they generate: node-lifetime, so they outlive sessions.

A session's Worker decides (`trexo.worker.plan`) and the pool does: it starts a runner for
an assignment and keeps it alive (restarting it with backoff when it dies) until told to
stop it; it forwards a task to a runner and streams the chunks to the requesting node. A
model stays loaded and a stream keeps flowing while the master changes: only the Worker,
which merely plans and reports, is swapped. Every process still has one owner nursery,
the pool's, so the node's stop reaps them all (README, Architecture).

What the pool learns (runner statuses, task progress) it posts as local events on
`facts`; the current session's Worker sends them to its master.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NoReturn

import attrs
import trio

from trexo import catalog, thread_pools
from trexo.config import (
    FINISHED_TASKS_REMEMBERED,
    REQUEST_BODIES_MAX_BYTES,
    REQUEST_BODY_TTL_S,
    RUNNER_RESTART_POLICY,
    STREAM_SEND_TIMEOUT_S,
    RestartPolicy,
    RunnerConfig,
)
from trexo.errors import (
    ClusterError,
    HubError,
    LoadFailed,
    RequestRejected,
    RunnerError,
    RunnerUnavailable,
)
from trexo.hub.downloads import Downloads
from trexo.lifecycle import RestartIntensity
from trexo.net.router import Envelope, PeerUnreachable, Router
from trexo.net.topics import Topic
from trexo.types.chunks import FinishReason
from trexo.types.failure import FailureKind
from trexo.types.generation import GenerationRequest
from trexo.types.ids import InstanceId, RequestId, RunnerId
from trexo.types.ipc import PromptCacheStats
from trexo.types.local_events import (
    LocalEvent,
    RankAddressReport,
    RunnerReport,
    TaskInFlight,
    TaskReport,
)
from trexo.types.runner_status import (
    TERMINAL_STATUSES,
    RunnerDownloading,
    RunnerFailed,
    RunnerIdle,
    RunnerReady,
    RunnerRunning,
    RunnerStatus,
)
from trexo.types.shard import RankGroup
from trexo.types.state import GroupState, Instance, RunnerAssignment, Task
from trexo.types.stream import StreamChunk, StreamFailed, TaskBody
from trexo.worker.plan import BringUp
from trexo.worker.rank_address import advertised_host, free_port, rank_address
from trexo.worker.request_bodies import RequestBodies
from trexo.worker.runner_supervisor import RunnerSupervisor

log = logging.getLogger(__name__)


def failure_kind(exc: Exception) -> FailureKind:
    """How the API should answer a task that failed with `exc`."""
    if isinstance(exc, RequestRejected):
        return FailureKind.INVALID_REQUEST
    if isinstance(exc, RunnerUnavailable):
        return FailureKind.UNAVAILABLE  # its restart is on the way: retry shortly
    return FailureKind.INTERNAL


@attrs.frozen
class _LoadError:
    message: str
    permanent: bool
    """Loading again would fail the same way: the runner is not restarted."""


@attrs.define
class PoolRunner:
    """One assignment's runner, through all of its restarts."""

    instance: Instance
    assignment: RunnerAssignment
    supervisor: RunnerSupervisor | None = None
    """The current process's supervisor (None between a death and the restart)."""
    status: RunnerStatus = RunnerIdle()
    """What was last reported of it (its supervisor's status, or the pending restart)."""
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    group: GroupState | None = None
    """Its split instance's rank group as last told (None: whole model, or not told yet)."""
    group_changed: trio.Event = attrs.field(factory=trio.Event)
    bring_up: BringUp = ()
    """The other ranks' progress while the group forms, as last told (`plan.bring_up`)."""
    address: RankAddressReport | None = None
    """The address this rank reported for the group's current epoch."""

    @property
    def runner_id(self) -> RunnerId:
        return self.assignment.runner_id

    def set_group(self, group: GroupState, bring_up: BringUp = ()) -> None:
        self.group = group
        self.bring_up = bring_up
        self.group_changed.set()
        self.group_changed = trio.Event()

    async def wait_group(self, ready: Callable[[GroupState], bool]) -> GroupState:
        """Until the group, as last told, satisfies `ready`."""
        while self.group is None or not ready(self.group):
            await self.group_changed.wait()
        return self.group


class _EpochMoved(Exception):
    """The group of a rank's process was rebuilt (a new epoch): start again, at once."""


@attrs.define
class _InFlight:
    task: Task
    supervisor: RunnerSupervisor
    cancelling: bool = False


class RunnerPool:
    """Start with `await nursery.start(pool.run)`; it returns itself once ready."""

    def __init__(
        self,
        router: Router,
        *,
        models_dir: Path,
        runner_logs_dir: Path,
        runner_config: RunnerConfig = RunnerConfig(),
        downloads: Downloads | None = None,
        runner_env: dict[str, str] | None = None,
        restart_policy: RestartPolicy = RUNNER_RESTART_POLICY,
        finished_remembered: int = FINISHED_TASKS_REMEMBERED,
        request_body_ttl: float = REQUEST_BODY_TTL_S,
        request_bodies_max_bytes: int = REQUEST_BODIES_MAX_BYTES,
    ) -> None:
        self._router = router
        self._models_dir = models_dir
        self._runner_logs_dir = runner_logs_dir
        self._runner_config = runner_config
        self._downloads = downloads
        self._runner_env = runner_env or {}
        self._restart_policy = restart_policy
        self._finished_remembered = finished_remembered
        self._runners: dict[RunnerId, PoolRunner] = {}
        self._failures: dict[InstanceId, RestartIntensity] = {}
        """Recent runner deaths per instance: they set the next restart's backoff."""
        self._inflight: dict[RequestId, _InFlight] = {}
        self.finished: OrderedDict[RequestId, FinishReason] = OrderedDict()
        """Tasks that ended here recently, with how: a new master that still lists one (the
        report went to the old master) is told again, and it is never run twice."""
        self._changed = trio.Event()
        self._facts_send, self.facts = trio.open_memory_channel[LocalEvent](math.inf)
        self._nursery: trio.Nursery | None = None
        self.bodies = RequestBodies(ttl=request_body_ttl, max_bytes=request_bodies_max_bytes)
        """Requests of tasks led here that have not been forwarded yet."""

    # --- the service -------------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[RunnerPool] = trio.TASK_STATUS_IGNORED
    ) -> None:
        with self._router.subscribe(Topic.REQUESTS) as bodies:
            async with self._facts_send, trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    task_status.started(self)
                    await self._receive_bodies(bodies)
                finally:
                    self._nursery = None

    async def _receive_bodies(self, inbox: trio.MemoryReceiveChannel[Envelope]) -> None:
        """Hold the requests that origins send for tasks led here, until forwarded."""
        async for envelope in inbox:
            body = envelope.payload
            if not isinstance(body, TaskBody):
                log.warning(
                    "dropped a %s on the requests topic from %s",
                    type(body).__name__,
                    envelope.sender,
                )
                continue
            if self.bodies.put(body.request, trio.current_time(), origin=envelope.sender):
                self._signal()

    # --- what the worker reads -------------------------------------------------------------

    @property
    def runners(self) -> dict[RunnerId, PoolRunner]:
        """The runners this pool keeps alive now (starting, loading, ready, restarting)."""
        return dict(self._runners)

    def prompt_caches(self) -> dict[RunnerId, PromptCacheStats]:
        """Each local runner's prompt cache, as it last reported it."""
        return {
            rid: r.supervisor.prompt_cache
            for rid, r in self._runners.items()
            if r.supervisor is not None
        }

    @property
    def groups(self) -> dict[RunnerId, GroupState]:
        """The rank group each runner of a split instance was last told of."""
        return {rid: r.group for rid, r in self._runners.items() if r.group is not None}

    @property
    def bring_ups(self) -> dict[RunnerId, BringUp]:
        """The other ranks' progress each runner of a forming group was last told of."""
        return {rid: r.bring_up for rid, r in self._runners.items() if r.bring_up}

    @property
    def inflight(self) -> dict[RequestId, Task]:
        """Tasks being generated now."""
        return {rid: entry.task for rid, entry in self._inflight.items()}

    @property
    def cancelling(self) -> frozenset[RequestId]:
        return frozenset(rid for rid, entry in self._inflight.items() if entry.cancelling)

    async def wait_change(self) -> None:
        """Until a runner or task here starts, changes status or ends."""
        await self._changed.wait()

    def _signal(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _post(self, fact: LocalEvent) -> None:
        self._facts_send.send_nowait(fact)

    def facts_now(self) -> list[LocalEvent]:
        """Everything a new master should hear from this node: each runner's status and
        each task in flight (it adopts those it missed)."""
        facts: list[LocalEvent] = [
            RunnerReport(r.runner_id, r.instance.instance_id, r.status)
            for r in self._runners.values()
        ]
        facts += [r.address for r in self._runners.values() if r.address is not None]
        facts += [TaskInFlight(entry.task) for entry in self._inflight.values()]
        return facts

    # --- runners -----------------------------------------------------------------------------

    def start(self, instance: Instance, assignment: RunnerAssignment) -> None:
        """Keep a runner alive for `assignment` until `stop`; no-op if it has one already."""
        if assignment.runner_id in self._runners:
            return
        entry = PoolRunner(instance, assignment)
        self._runners[assignment.runner_id] = entry
        self._spawn(self._keep_alive, entry)
        self._signal()

    def stop(self, runner_id: RunnerId) -> None:
        """Stop a runner (its ladder runs); it leaves `runners` once reaped."""
        entry = self._runners.get(runner_id)
        if entry is not None:
            log.info("stopping runner %s: its instance is gone", runner_id)
            entry.scope.cancel()

    def update_group(self, runner_id: RunnerId, group: GroupState, bring_up: BringUp = ()) -> None:
        """The state's word on a split runner's group: connect once complete, restart on a
        new epoch; while it forms, how far its other ranks have come."""
        entry = self._runners.get(runner_id)
        if entry is not None:
            entry.set_group(group, bring_up)
            self._signal()

    def _spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        if self._nursery is None:
            raise RuntimeError("the runner pool is not running")
        self._nursery.start_soon(fn, *args)

    def _set_status(self, entry: PoolRunner, status: RunnerStatus) -> None:
        entry.status = status
        self._post(RunnerReport(entry.runner_id, entry.instance.instance_id, status))
        self._signal()

    async def _keep_alive(self, entry: PoolRunner) -> None:
        try:
            with entry.scope:
                while True:
                    try:
                        load_error = await self._run_once(entry)
                    except _EpochMoved:
                        continue  # its peers restart too: no backoff, no failure
                    if load_error is not None and load_error.permanent:
                        await self._park(entry, load_error.message)
                    cause = load_error.message if load_error is not None else None
                    await self._wait_to_restart(entry, cause)
        finally:
            del self._runners[entry.runner_id]
            self._signal()

    async def _park(self, entry: PoolRunner, cause: str) -> NoReturn:
        """A load that failed for good: say so, and start nothing until the instance is
        deleted (its scope is cancelled then). Another attempt would fail the same way."""
        log.error("runner %s failed for good, not restarting: %s", entry.runner_id, cause)
        entry.supervisor = None
        self._set_status(entry, RunnerFailed(cause, permanent=True))
        await trio.sleep_forever()

    async def _run_once(self, entry: PoolRunner) -> _LoadError | None:
        """One runner process: spawn, load, serve until it exits; why it could not load.

        A rank of a split instance first reports its address and waits for its group's
        other ranks; its process ends, and `_EpochMoved` is raised, when the group is
        rebuilt (one of its peers failed).
        """
        supervisor = RunnerSupervisor(
            entry.runner_id,
            config=self._runner_config,
            log_dir=self._runner_logs_dir,
            env=self._runner_env,
            on_status=lambda status: self._set_status(entry, status),
        )
        entry.supervisor = supervisor
        model = entry.instance.model
        load_error = None
        moved = trio.Event()  # set when the group is rebuilt under this process
        async with trio.open_nursery() as nursery:
            # Spawned before its group forms: the interpreter's start overlaps the wait.
            await nursery.start(supervisor.run)
            try:
                # Node-lifetime, so neither a demo model's build nor a download ever delays a
                # session swap.
                model_dir, group = await self._prepare(entry, supervisor, nursery)
                if group is not None:
                    nursery.start_soon(
                        self._end_with_epoch, entry, group.epoch, supervisor, moved, nursery
                    )
                await supervisor.load(model_dir, entry.assignment.shard, group)
            except _EpochMoved:
                moved.set()
            # OSError: the model directory could not be read (no descriptor left, ...)
            except (RunnerError, ClusterError, HubError, OSError) as exc:
                log.error("runner %s could not load %s: %s", entry.runner_id, model.model_id, exc)
                permanent = isinstance(exc, LoadFailed) and exc.permanent
                load_error = _LoadError(f"could not load {model.model_id}: {exc}", permanent)
            if moved.is_set() or load_error is not None:
                nursery.cancel_scope.cancel()
        # A rank stopped because its peers restart is no failure of its own.
        if moved.is_set() and not isinstance(supervisor.status, RunnerFailed):
            raise _EpochMoved
        return load_error

    async def _prepare(
        self, entry: PoolRunner, supervisor: RunnerSupervisor, nursery: trio.Nursery
    ) -> tuple[Path, RankGroup | None]:
        """The model's files, and a split instance's group once formed; given up the moment
        the runner's process ends meanwhile (its failure is reported at once, so that its
        group's other ranks are not kept waiting for a rank that is gone). The watch runs in
        `nursery` (the process's): errors of the preparation stay plain exceptions."""
        watching = trio.CancelScope()
        with trio.CancelScope() as preparing:

            async def give_up_if_it_ends() -> None:
                with watching:
                    await supervisor.wait_status(lambda _: False)  # returns once terminal
                    preparing.cancel()

            nursery.start_soon(give_up_if_it_ends)
            try:
                model_dir = await self._model_files(entry)
                group = await self._join_group(entry) if entry.instance.is_split else None
                return model_dir, group
            finally:
                watching.cancel()
        raise RunnerUnavailable(f"runner {entry.runner_id} is not running ({supervisor.status})")

    async def _model_files(self, entry: PoolRunner) -> Path:
        """The directory the runner loads from, once it holds what its part needs: a demo
        model is built, a hub model's files for this shard downloaded."""
        model = entry.instance.model
        if model.hub_revision is None:
            return await thread_pools.run_sync("files", catalog.model_dir, model, self._models_dir)
        if self._downloads is None:
            raise RunnerUnavailable(f"this node cannot download models ({model.model_id})")
        self._set_status(entry, RunnerDownloading())
        shard = entry.assignment.shard
        return await self._downloads.fetch(model, None if shard.is_whole else shard)

    async def _join_group(self, entry: PoolRunner) -> RankGroup:
        """Report this rank's address for the group's epoch; wait until every rank has.

        Raises `RunnerUnavailable` when the group does not form in time, `_EpochMoved` when
        it is rebuilt meanwhile.
        """
        group = await entry.wait_group(lambda g: True)
        epoch = group.epoch
        if entry.address is None or entry.address.epoch != epoch:
            host = advertised_host(self._router, entry.instance)
            if host is None:
                raise RunnerUnavailable(
                    f"runner {entry.runner_id}: no link to another rank's node, so no address"
                )
            address = rank_address(host, free_port(host))
            entry.address = RankAddressReport(
                entry.instance.instance_id, entry.runner_id, epoch, address
            )
            self._post(entry.address)
            log.info(
                "runner %s: rank %d of epoch %d listens on %s",
                entry.runner_id,
                entry.assignment.shard.rank,
                epoch,
                address,
            )
        bound = self._runner_config.group_formation_timeout
        while True:
            # The bound is on silence: it starts again whenever a rank reports its address
            # or a missing rank shows progress (its runner's status, its node's download).
            seen = (entry.group, entry.bring_up)
            with trio.move_on_after(bound):
                formed = await entry.wait_group(
                    lambda g: (
                        g.epoch != epoch
                        or g.group is not None
                        or (entry.group, entry.bring_up) != seen  # noqa: B023 (awaited here)
                    )
                )
                if formed.epoch != epoch:
                    raise _EpochMoved
                if formed.group is None:
                    continue  # progress, not yet formed
                # Rank 0 connects first: a ring whose rank 0 comes late costs a second or more.
                await trio.sleep(
                    self._runner_config.group_rank_stagger * entry.assignment.shard.rank
                )
                return formed.group
            latest = entry.group or group
            missing = [r for r, a in enumerate(latest.addresses) if a is None]
            raise RunnerUnavailable(
                f"the group of instance {entry.instance.instance_id} did not form: no progress"
                f" for {bound:g} s (epoch {epoch}; no address from ranks"
                f" {', '.join(map(str, missing))})"
            )

    @staticmethod
    async def _end_with_epoch(
        entry: PoolRunner,
        epoch: int,
        supervisor: RunnerSupervisor,
        moved: trio.Event,
        process_nursery: trio.Nursery,
    ) -> None:
        """Stop the rank's process (its ladder runs) when its group is rebuilt; return when
        the process has ended either way."""
        async with trio.open_nursery() as race:

            async def process_ended() -> None:
                await supervisor.wait_status(lambda _: False)  # returns once terminal
                race.cancel_scope.cancel()

            race.start_soon(process_ended)
            await entry.wait_group(lambda g: g.epoch != epoch)
            log.info("runner %s: its group moved past epoch %d; restarting", entry.runner_id, epoch)
            moved.set()
            process_nursery.cancel_scope.cancel()

    async def _wait_to_restart(self, entry: PoolRunner, load_error: str | None) -> None:
        """Back off before the runner that just ended is started again (its restart policy)."""
        supervisor = entry.supervisor
        assert supervisor is not None
        now = trio.current_time()
        policy = self._restart_policy
        iid = entry.instance.instance_id
        history = self._failures.get(
            iid, RestartIntensity(policy.max_restarts, policy.window)
        ).record(now)
        self._failures[iid] = history
        delay = policy.restart_delay(history.count(now))
        status = supervisor.status
        cause = (
            load_error
            or (status.cause if isinstance(status, RunnerFailed) else None)
            or supervisor.exit_cause
        )
        log.warning(
            "runner %s failed (%s), %d time(s) in %.0f s; restarting in %.1f s",
            entry.runner_id,
            cause,
            history.count(now),
            policy.window,
            delay,
        )
        entry.supervisor = None
        self._set_status(entry, RunnerFailed(str(cause), restart_in=delay))
        await trio.sleep(delay)

    # --- tasks -------------------------------------------------------------------------------

    def taken(self, task_id: RequestId) -> bool:
        """Whether `task_id` runs here now or ended here (so it is never run twice)."""
        return task_id in self._inflight or task_id in self.finished

    def forward(self, task: Task, runner_id: RunnerId) -> None:
        """Run `task` on the local runner `runner_id`; stream its chunks to the task's origin.
        Its request must be held in `bodies` (it is taken from there)."""
        entry = self._runners[runner_id]
        request = self.bodies.take(task.task_id, origin=task.origin_node)
        if request is None:
            raise ValueError(f"task {task.task_id} is forwarded before its request came")
        if entry.supervisor is None or isinstance(entry.supervisor.status, TERMINAL_STATUSES):
            # Between a death and the restart: fail it now, as retryable.
            self._finish(task, "error")
            self._spawn(
                self._tell_origin,
                task,
                StreamFailed(
                    task.task_id,
                    f"runner {runner_id} is restarting ({entry.status}); retry shortly",
                    FailureKind.UNAVAILABLE,
                ),
            )
            return
        self._inflight[task.task_id] = _InFlight(task, entry.supervisor)
        self._spawn(self._forward, task, request, entry.supervisor)
        self._signal()

    def cancel(self, task_id: RequestId) -> None:
        """The task left the state: stop it in its runner (its stream ends "cancelled")."""
        entry = self._inflight.get(task_id)
        if entry is not None and not entry.cancelling:
            entry.cancelling = True
            self._spawn(entry.supervisor.cancel, task_id)

    def forget_finished(self, keep: set[RequestId]) -> None:
        """Forget finished tasks that the state no longer lists (nothing can run them again)."""
        for task_id in [t for t in self.finished if t not in keep]:
            del self.finished[task_id]

    def _finish(self, task: Task, reason: FinishReason) -> None:
        self._inflight.pop(task.task_id, None)
        self.finished[task.task_id] = reason
        while len(self.finished) > self._finished_remembered:
            self.finished.popitem(last=False)
        self._post(TaskReport(task.task_id, finish_reason=reason))
        self._signal()

    async def _forward(
        self, task: Task, request: GenerationRequest, supervisor: RunnerSupervisor
    ) -> None:
        reason: FinishReason = "error"
        try:
            status = await supervisor.wait_status(
                lambda s: isinstance(s, RunnerReady | RunnerRunning)
            )
            if isinstance(status, TERMINAL_STATUSES):
                raise RunnerUnavailable(f"runner {supervisor.runner_id} is down: {status}")
            self._post(TaskReport(task.task_id, "running"))
            async with supervisor.open_generation(request) as stream:
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
            self._finish(task, reason)

    async def _tell_origin(self, task: Task, item: StreamFailed) -> None:
        try:
            with trio.move_on_after(STREAM_SEND_TIMEOUT_S):
                await self._router.send(task.origin_node, Topic.STREAM, item)
        except PeerUnreachable:
            log.info("task %s: requesting node gone", task.task_id)
