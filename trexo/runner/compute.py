"""The runner's one compute thread: it owns the MLX engine and runs jobs in arrival order.

MLX streams belong to the OS thread that created them, so loading and every decode step run
on this single thread for the runner's whole life. The trio side talks to it through a
queue (jobs in) and a `post` callback (messages out); a stop flag is checked between steps.

A runner that is one rank of a split model (a `LoadModel` with a group) joins the group,
loads its part, and from then on runs the generations rank 0 shares with the group, in step
with every other rank (`trexo.runner.lockstep`). Only rank 0 takes requests and posts chunks.
"""

from __future__ import annotations

import logging
import math
import queue
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from trexo.runner.exit_codes import EXIT_GROUP_BROKEN, EXIT_RANK_FAILED
from trexo.runner.hooks import TestHooks
from trexo.runner.lockstep import GroupStep, StallWatch, StepUndecodable, decode_step, encode_step
from trexo.types.chunks import Chunk, Usage
from trexo.types.failure import FailureKind
from trexo.types.generation import GenerationRequest
from trexo.types.ids import RequestId
from trexo.types.ipc import (
    ChunkMessage,
    FromRunner,
    GroupJoined,
    LoadModel,
    RequestFailed,
    StatusReport,
)
from trexo.types.runner_status import (
    RunnerFailed,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerStatus,
)

if TYPE_CHECKING:
    from trexo.engine.engine import Engine
    from trexo.engine.sharding import GroupLink

log = logging.getLogger(__name__)

Job = LoadModel | GenerationRequest
INIT_GIVE_UP_MARGIN_S = 5.0
"""A rank stuck joining its group kills itself this long after its parent gave up on it
(normally the parent's stop ladder has ended it by then; this covers a parent that died)."""
GROUP_FAILURE = FailureKind.UNAVAILABLE
"""A request lost with its group: retry it once the group is rebuilt."""
GROUP_ENDING = "rank group ended: one of its ranks is being stopped"
DRAIN_BEFORE_JOIN_TIMEOUT_S = 1.0
"""How long a rank waits for its "loading" status to reach the parent before it joins."""
SEED_BITS = 31
"""Rank 0 gives an unseeded request a seed: every rank must sample the same tokens."""


def _nothing() -> None:
    pass


def _drained(_timeout: float) -> bool:
    return True


class _GroupEnding(Exception):
    """A rank is leaving (its parent stops it): every rank ends the group at this step."""


class ComputeThread:
    """Owns the engine. `post` must be safe to call from this thread (see `runner.serve`).

    `on_end` is called from this thread when its loop has ended, whether asked to or by
    itself (a broken group); `exit_code` then says which exit code the runner should use.
    `drain(timeout)` waits until everything posted so far has been sent to the parent.
    """

    def __init__(
        self,
        post: Callable[[FromRunner], None],
        hooks: TestHooks = TestHooks(),
        on_end: Callable[[], None] = _nothing,
        drain: Callable[[float], bool] = _drained,
    ) -> None:
        self._post = post
        self._hooks = hooks
        self._on_end = on_end
        self._drain = drain
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pending: set[RequestId] = set()  # queued or running generations
        self._cancelled: set[RequestId] = set()
        self._engine: Engine | None = None
        self._thread = threading.Thread(target=self._loop, name="trexo-compute")
        self.watch = StallWatch()
        self.rank: int | None = None
        """This runner's rank, once asked to join a group."""
        self.stall_timeout = math.inf
        self.exit_code: int | None = None
        """Set when the loop ended by itself: the exit code the runner should leave with."""

    # --- called from the trio thread -------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit_load(self, msg: LoadModel) -> None:
        if msg.group is not None and self.rank is None:
            self.rank = msg.shard.rank
            self.stall_timeout = msg.group_stall_timeout
        self._jobs.put(msg)

    def submit_generate(self, request: GenerationRequest) -> None:
        if self.rank:  # rank 0 speaks for the group
            self._post(
                RequestFailed(request.request_id, f"rank {self.rank} does not take requests")
            )
            return
        with self._lock:
            self._pending.add(request.request_id)
        self._jobs.put(request)

    def cancel(self, request_id: RequestId) -> None:
        """Cancel a queued or running generation; unknown ids are ignored (it already ended)."""
        with self._lock:
            if request_id in self._pending:
                self._cancelled.add(request_id)

    def request_stop(self) -> None:
        """Ask the loop to end after the current step. Idempotent."""
        self._stop.set()
        self._jobs.put(None)

    def join(self, timeout: float) -> bool:
        """Wait for the thread; True if it has finished."""
        if self._thread.is_alive() or self._thread.ident is not None:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def active_requests(self) -> list[RequestId]:
        """The generations queued or running (rank 0's; a rank > 0 takes none)."""
        with self._lock:
            return sorted(self._pending)

    def stalled_for(self, now: float | None = None) -> float | None:
        """Seconds this rank has waited on its peers, if more than the stall timeout."""
        waited = self.watch.waited(now)
        return waited if waited > self.stall_timeout else None

    # --- the compute thread ---------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                job = self._jobs.get()
                if job is None:
                    break
                if isinstance(job, LoadModel) and job.group is not None:
                    self._serve_group(job)  # for the rest of this runner's life
                    break
                if isinstance(job, LoadModel):
                    self._load(job)
                else:
                    self._generate(job)
        finally:
            self._engine = None  # drop the model's arrays on this thread
            self._on_end()

    def _status(self, status: RunnerStatus) -> None:
        self._post(StatusReport(status))

    def _load_engine(self, job: LoadModel, world: object = None) -> Engine:
        from trexo.engine.engine import Engine  # mlx is imported here, after BLAS setup

        return Engine.load(
            Path(job.model_dir),
            job.shard,
            on_progress=lambda progress: self._status(RunnerLoading(progress)),
            prefill_step=job.prefill_step,
            world=world,
        )

    def _load(self, job: LoadModel) -> None:
        self._status(RunnerLoading(0.0))
        if self._hooks.load_delay:
            time.sleep(self._hooks.load_delay)
        try:
            engine = self._load_engine(job)
            engine.warmup()
        except Exception as exc:
            log.exception("loading %s failed", job.model_dir)
            self._status(RunnerFailed(f"load failed: {type(exc).__name__}: {exc}"))
            return
        self._engine = engine
        log.info("model %s loaded", job.model_dir)
        self._status(RunnerReady())

    def _should_stop(self, request_id: RequestId) -> bool:
        if self._hooks.stop_check_delay:
            time.sleep(self._hooks.stop_check_delay)
        return self._stop.is_set() or request_id in self._cancelled

    def _generate(self, request: GenerationRequest) -> None:
        rid = request.request_id
        try:
            if self._should_stop(rid):
                # Cancelled while queued: it never reaches the engine, but ends the same way.
                self._send_chunk(Chunk(rid, "", finish_reason="cancelled", usage=Usage(0, 0)))
            elif self._engine is None:
                self._post(RequestFailed(rid, "no model is loaded in this runner"))
            else:
                self._status(RunnerRunning(self._active()))
                try:
                    chunks = self._engine.generate(request, lambda: self._should_stop(rid))
                except ValueError as exc:  # the request as it stands cannot be served
                    log.info("generation %s refused: %s", rid, exc)
                    self._post(RequestFailed(rid, str(exc), FailureKind.INVALID_REQUEST))
                    return
                for chunk in chunks:
                    self._send_chunk(chunk)
                    if chunk.finish_reason is None and self._hooks.step_delay:
                        time.sleep(self._hooks.step_delay)
        except Exception as exc:
            log.exception("generation %s failed", rid)
            self._post(RequestFailed(rid, f"{type(exc).__name__}: {exc}"))
        finally:
            self._forget(rid)
            if self._engine is not None:
                active = self._active()
                self._status(RunnerRunning(active) if active else RunnerReady())

    def _send_chunk(self, chunk: Chunk) -> None:
        """Post `chunk`; a final one is logged, whichever path ended the generation."""
        self._post(ChunkMessage(chunk))
        if chunk.finish_reason is not None:
            log.info(
                "generation %s finished: %s, %s",
                chunk.request_id,
                chunk.finish_reason,
                chunk.usage,
            )

    def _active(self) -> int:
        with self._lock:
            return len(self._pending)

    def _forget(self, request_id: RequestId) -> None:
        with self._lock:
            self._pending.discard(request_id)
            self._cancelled.discard(request_id)

    # --- one rank of a group --------------------------------------------------------------

    def _serve_group(self, job: LoadModel) -> None:
        """Join the group, load this rank's part, then step with the group until it ends."""
        from trexo.engine.sharding import GroupBroken

        link = self._join(job)
        if link is None:
            return
        try:
            self._load_rank(job, link)
        except GroupBroken as exc:
            log.error("rank %d: rank group broken while loading: %s", link.rank, exc)
            self._end_by_itself(EXIT_GROUP_BROKEN)
            self._status(RunnerFailed(f"load failed: rank group broken: {exc}"))
            return
        except Exception as exc:
            log.exception("rank %d: loading %s failed", link.rank, job.model_dir)
            self._end_by_itself(EXIT_RANK_FAILED)  # a rank that cannot step must leave
            self._status(RunnerFailed(f"load failed: {type(exc).__name__}: {exc}"))
            return
        try:
            if link.is_lead:
                self._lead(link, job.group_idle_tick)
            else:
                self._follow(link)
        except GroupBroken as exc:
            log.error("rank %d: rank group broken: %s", link.rank, exc)
            self._end_by_itself(EXIT_GROUP_BROKEN)
        except _GroupEnding:
            log.info("rank %d: a rank is leaving; the group ends", link.rank)
            self._end_by_itself(EXIT_GROUP_BROKEN)

    def _end_by_itself(self, exit_code: int) -> None:
        """Record why the loop ends, unless our parent stopped us (then it ends cleanly).

        Decided before the parent hears of the failure: it may stop us once it has."""
        if not self._stop.is_set():
            self.exit_code = exit_code

    def _join(self, job: LoadModel) -> GroupLink | None:
        assert job.group is not None
        rank, hosts = job.shard.rank, job.group.hosts
        self._status(RunnerLoading(0.0))
        log.info(
            "rank %d of %d: joining group epoch %d (%s)",
            rank,
            len(hosts),
            job.group.epoch,
            ", ".join(hosts),
        )
        # `init` holds the GIL until every peer is there: this process's trio side cannot
        # send anything meanwhile, so make sure the parent knows we are joining first.
        if not self._drain(DRAIN_BEFORE_JOIN_TIMEOUT_S):
            log.warning("rank %d: the parent is not reading; joining anyway", rank)
        if self._stop.is_set():
            return None
        started = time.monotonic()
        try:
            from trexo.engine.sharding import GroupLink, join_group

            world = join_group(job.group, rank, job.group_init_timeout + INIT_GIVE_UP_MARGIN_S)
        except Exception as exc:
            log.exception("rank %d: could not join the group", rank)
            self._end_by_itself(EXIT_RANK_FAILED)
            self._status(RunnerFailed(f"load failed: could not join the rank group: {exc}"))
            return None
        log.info("rank %d of %d: joined in %.3f s", rank, len(hosts), time.monotonic() - started)
        self._post(GroupJoined(rank, len(hosts)))
        return GroupLink(world, self.watch)

    def _load_rank(self, job: LoadModel, link: GroupLink) -> None:
        if self._hooks.load_delay:
            time.sleep(self._hooks.load_delay)
        engine = self._load_engine(job, link.world)
        # Peers may take longer to read their weights: wait for them unwatched (the parent's
        # load timeout bounds it). From here on every rank does the same, step by step.
        link.barrier()
        engine.warmup()
        self._engine = engine
        log.info("rank %d: model %s loaded (%s)", link.rank, job.model_dir, job.shard)
        self._status(RunnerReady())

    def _lead(self, link: GroupLink, idle_tick: float) -> None:
        """Rank 0: take the next request (or none, after `idle_tick`) and share it."""
        while True:
            self.watch.rest()
            request = self._next_request(idle_tick)
            step = GroupStep(start=(_seeded(request),)) if request is not None else GroupStep()
            self._run_step(link, self._share_step(link, step))

    def _follow(self, link: GroupLink) -> None:
        """Rank > 0: do what rank 0 shares, until the group ends."""
        while True:
            self._run_step(link, self._share_step(link, GroupStep()))

    def _share_step(self, link: GroupLink, step: GroupStep) -> GroupStep:
        """Rank 0's `step`, on every rank; `_GroupEnding` if a rank is leaving."""
        from trexo.engine.sharding import GroupBroken

        data, leaving = link.share_bytes(encode_step(step), leaving=self._stop.is_set())
        if leaving:
            for request in step.start:  # rank 0's, taken from its queue but never started
                self._post(RequestFailed(request.request_id, GROUP_ENDING, GROUP_FAILURE))
            raise _GroupEnding
        try:
            return decode_step(data)
        except StepUndecodable as exc:
            raise GroupBroken(f"rank 0 shared an undecodable step: {exc}") from exc

    def _run_step(self, link: GroupLink, step: GroupStep) -> None:
        for request in step.start:
            self._generate_in_group(request, link)

    def _next_request(self, timeout: float) -> GenerationRequest | None:
        try:
            job = self._jobs.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(job, LoadModel):
            log.warning("already serving a rank group: ignoring a second LoadModel")
            return None
        return job  # None too: the stop sentinel (the stop flag is what counts)

    def _generate_in_group(self, request: GenerationRequest, link: GroupLink) -> None:
        """Run `request` in step with every rank; any failure breaks the group."""
        from trexo.engine.sharding import GroupBroken

        assert self._engine is not None
        rid = request.request_id
        self._status(RunnerRunning(1))
        try:
            try:
                chunks = self._engine.generate(request, lambda: self._group_should_stop(rid, link))
            except ValueError as exc:  # the same on every rank: nobody starts it
                if link.is_lead:
                    log.info("generation %s refused: %s", rid, exc)
                    self._post(RequestFailed(rid, str(exc), FailureKind.INVALID_REQUEST))
                self._status(RunnerReady())
                return
            for chunk in chunks:
                if link.is_lead:
                    self._send_chunk(chunk)
                if chunk.finish_reason is None and self._hooks.step_delay:
                    time.sleep(self._hooks.step_delay)
        except _GroupEnding:
            if link.is_lead:
                self._post(RequestFailed(rid, GROUP_ENDING, GROUP_FAILURE))
            raise
        except GroupBroken as exc:
            if link.is_lead:
                self._post(RequestFailed(rid, f"rank group broken: {exc}", GROUP_FAILURE))
            raise
        except Exception as exc:
            # A rank that failed alone is out of step with the others: the group is broken.
            log.exception("rank %d: generation %s failed", link.rank, rid)
            broken = f"{type(exc).__name__}: {exc}"
            if link.is_lead:
                self._post(RequestFailed(rid, f"rank group broken: {broken}", GROUP_FAILURE))
            raise GroupBroken(broken) from exc
        finally:
            self._forget(rid)
        self._status(RunnerReady())

    def _group_should_stop(self, request_id: RequestId, link: GroupLink) -> bool:
        """Rank 0's stop decision, the same on every rank at the same step.

        Rank 0 stopping cancels the generation ("cancelled", as in a whole-model runner);
        the next step then ends the group. A rank > 0 stopping ends it at once.
        """
        if self._hooks.stop_check_delay:
            time.sleep(self._hooks.stop_check_delay)
        stop, leaving = link.share_flags(
            stop=link.is_lead and self._should_stop(request_id),
            leaving=not link.is_lead and self._stop.is_set(),
        )
        if leaving:
            raise _GroupEnding
        return stop


def _seeded(request: GenerationRequest) -> GenerationRequest:
    if request.params.seed is not None:
        return request
    params = attrs.evolve(request.params, seed=random.getrandbits(SEED_BITS))
    return attrs.evolve(request, params=params)
