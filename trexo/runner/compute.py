"""The runner's one compute thread: it owns the MLX engine and steps every generation.

MLX streams belong to the OS thread that created them, so loading and every step run on
this single thread for the runner's whole life. The trio side talks to it through a queue
(jobs in) and a `post` callback (messages out); a stop flag is checked between steps.

Generations are batched (`trexo.engine.batch`): between two steps new requests join and
cancelled ones leave, and each step advances every one of them by a token (or a prompt
chunk). A runner that is one rank of a split model (a `LoadModel` with a group) joins the
group, loads its part, and from then on makes the same joins and leaves as every other rank,
as rank 0 decides and shares them before each step (`trexo.runner.lockstep`). Only rank 0
takes requests and posts chunks.
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
from trexo.runner.load_failure import is_permanent
from trexo.runner.lockstep import GroupStep, StallWatch, StepUndecodable, decode_step, encode_step
from trexo.types.chunks import Chunk, Usage
from trexo.types.failure import FailureKind
from trexo.types.generation import GenerationRequest
from trexo.types.ids import RequestId
from trexo.types.ipc import (
    CacheReport,
    ChunkBatch,
    ChunkMessage,
    FromRunner,
    GroupJoined,
    JoiningGroup,
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
    from trexo.engine.batch import BatchEngine
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
STEP_FAILED = "the runner's generation step failed (its log says why); retry"
"""What every request in a failed step hears: the cause may be another request's."""


def _nothing() -> None:
    pass


def _drained(_timeout: float) -> bool:
    return True


def load_failed(exc: Exception) -> RunnerFailed:
    """The status of a runner whose load raised `exc`: permanent when loading again would
    fail the same way (`trexo.runner.load_failure`)."""
    return RunnerFailed(f"load failed: {type(exc).__name__}: {exc}", permanent=is_permanent(exc))


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
        self._loading = False
        self._lock = threading.Lock()
        self._pending: set[RequestId] = set()  # queued or running generations
        self._cancelled: set[RequestId] = set()
        self._engine: Engine | None = None
        self._batch: BatchEngine | None = None
        self._load_job: LoadModel | None = None
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

    @property
    def loading(self) -> bool:
        """Busy loading a model (imports, joining a group, reading weights, warm-up): work
        that does not look at the stop flag, and that nothing needs finished once stopped."""
        return self._loading

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

    def stalled_for(self, now: float | None = None, stretch: float = 1.0) -> float | None:
        """Seconds this rank has waited on its peers, if more than the stall timeout times
        `stretch`."""
        waited = self.watch.waited(now)
        return waited if waited > self.stall_timeout * stretch else None

    # --- the compute thread ---------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                for job in self._next_jobs(block=self._batch is None or not self._batch):
                    if isinstance(job, LoadModel):
                        # From here: imports, then the load. Set before the stop check, so
                        # that a stop from now on makes the runner leave at once.
                        self._loading = True
                    if self._stop.is_set():
                        break  # a load that came with the stop would import for seconds
                    if isinstance(job, LoadModel) and job.group is not None:
                        self._serve_group(job)  # for the rest of this runner's life
                        return
                    if isinstance(job, LoadModel):
                        try:
                            self._load(job)
                        finally:
                            self._loading = False
                    else:
                        self._start(job)
                if self._batch is not None and self._batch:
                    self._cancel_requested()
                    self._step()
            # Stopped: what still runs ends as cancelled (its text so far is an answer).
            for rid in self.active_requests():
                if self._batch is not None and rid in self._batch:
                    self._end(rid)
        finally:
            self._batch = None
            self._engine = None  # drop the model's arrays on this thread
            self._on_end()

    def _next_jobs(self, *, block: bool, timeout: float | None = None) -> list[Job]:
        """The jobs queued now; with `block`, wait (up to `timeout`) for at least one. The stop
        sentinel (None) ends the list: the stop flag is what counts."""
        jobs: list[Job] = []
        try:
            job = self._jobs.get(timeout=timeout) if block else self._jobs.get_nowait()
            while job is not None:
                jobs.append(job)
                job = self._jobs.get_nowait()
        except queue.Empty:
            pass
        return jobs

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
        if self._engine is not None:
            log.warning("a model is loaded already: ignoring a second LoadModel")
            return
        self._status(RunnerLoading(0.0))
        if self._hooks.load_delay:
            time.sleep(self._hooks.load_delay)
        try:
            engine = self._load_engine(job)
            engine.warmup()
        except Exception as exc:
            log.exception("loading %s failed", job.model_dir)
            self._status(load_failed(exc))
            return
        self._use(engine, job)
        log.info("model %s loaded", job.model_dir)
        self._status(RunnerReady())

    def _use(self, engine: Engine, job: LoadModel) -> None:
        self._engine = engine
        self._load_job = job
        self._batch = self._new_batch()

    def _new_batch(self) -> BatchEngine:
        assert self._engine is not None and self._load_job is not None
        job = self._load_job
        return self._engine.batch(
            max_batch=job.max_batch, prompt_cache_bytes=job.prompt_cache_bytes
        )

    def _should_stop(self, request_id: RequestId) -> bool:
        return self._stop.is_set() or request_id in self._cancelled

    def _start(self, request: GenerationRequest) -> bool:
        """Let `request` join the batch at the next step; False if it did not (refused,
        cancelled while queued, no model)."""
        rid = request.request_id
        if self._should_stop(rid):
            # Cancelled while queued: it never reaches the engine, but ends the same way.
            self._send_chunk(Chunk(rid, "", finish_reason="cancelled", usage=Usage(0, 0)))
            self._forget(rid)
            return False
        if self._engine is None or self._batch is None:
            self._post(RequestFailed(rid, "no model is loaded in this runner"))
            self._forget(rid)
            return False
        try:
            self._batch.add(*self._engine.admit(request))
        except ValueError as exc:  # the request as it stands cannot be served
            log.info("generation %s refused: %s", rid, exc)
            self._post(RequestFailed(rid, str(exc), FailureKind.INVALID_REQUEST))
            self._forget(rid)
            return False
        except Exception as exc:
            # Nothing of it reached a step: it fails alone, and the others go on.
            log.exception("generation %s could not start", rid)
            self._post(RequestFailed(rid, f"could not start: {type(exc).__name__}: {exc}"))
            self._forget(rid)
            return False
        self._status(RunnerRunning(len(self._batch)))
        return True

    def _cancel_requested(self) -> None:
        """End the running generations whose cancel came in since the last step."""
        if self._hooks.stop_check_delay:
            time.sleep(self._hooks.stop_check_delay)
        with self._lock:
            cancelled = list(self._cancelled)
        for rid in cancelled:
            self._end(rid)

    def _end(self, request_id: RequestId) -> None:
        assert self._batch is not None
        final = self._batch.remove(request_id)
        if final is not None:
            self._send_chunk(final)
            self._finished(request_id)

    def _step(self) -> None:
        """One step of every running generation; their chunks go to the parent."""
        assert self._batch is not None
        try:
            chunks = self._batch.step()
        except Exception:
            # Whatever broke, the batch's state is unknown: fail what ran in it, start anew.
            # Which request broke it is unknown too, so none hears another's error text.
            log.exception("a generation step failed")
            for rid in self.active_requests():
                self._post(RequestFailed(rid, STEP_FAILED))
                self._forget(rid)
            self._batch = self._new_batch()
            self._status(RunnerReady())
            return
        self._deliver(chunks)
        if self._hooks.step_delay and self._batch:
            time.sleep(self._hooks.step_delay)

    def _deliver(self, chunks: list[Chunk]) -> None:
        """A step's chunks, in one message (a frame per step, not per token)."""
        if not chunks:
            return
        self._post(ChunkBatch(tuple(chunks)))
        for chunk in chunks:
            if chunk.finish_reason is not None:
                self._log_final(chunk)
                self._finished(chunk.request_id)

    def _finished(self, request_id: RequestId) -> None:
        self._forget(request_id)
        running = len(self._batch) if self._batch is not None else 0
        self._status(RunnerRunning(running) if running else RunnerReady())
        if self._batch is not None:
            self._post(CacheReport(self._batch.cache_stats()))

    def _send_chunk(self, chunk: Chunk) -> None:
        """Post `chunk`; a final one is logged, whichever path ended the generation."""
        self._post(ChunkMessage(chunk))
        if chunk.finish_reason is not None:
            self._log_final(chunk)

    @staticmethod
    def _log_final(chunk: Chunk) -> None:
        log.info(
            "generation %s finished: %s, %s", chunk.request_id, chunk.finish_reason, chunk.usage
        )

    def _forget(self, request_id: RequestId) -> None:
        with self._lock:
            self._pending.discard(request_id)
            self._cancelled.discard(request_id)

    # --- one rank of a group --------------------------------------------------------------

    def _serve_group(self, job: LoadModel) -> None:
        """Join the group, load this rank's part, then step with the group until it ends."""
        from trexo.engine.sharding import GroupBroken

        try:
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
                self._status(load_failed(exc))
                return
        finally:
            self._loading = False
        try:
            if link.is_lead:
                self._lead(link, job.group_idle_tick)
            else:
                self._follow(link)
        except GroupBroken as exc:
            log.error("rank %d: rank group broken: %s", link.rank, exc)
            self._end_by_itself(EXIT_GROUP_BROKEN)
            self._fail_all(f"rank group broken: {exc}")
        except _GroupEnding:
            log.info("rank %d: a rank is leaving; the group ends", link.rank)
            self._end_by_itself(EXIT_GROUP_BROKEN)
            self._fail_all(GROUP_ENDING)

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
        from trexo.engine.sharding import GroupLink, join_group  # seconds on a busy machine

        self._post(JoiningGroup(rank, len(hosts)))
        # `init` holds the GIL until every peer is there: this process's trio side cannot
        # send anything meanwhile, so make sure the parent knows we are joining first.
        if not self._drain(DRAIN_BEFORE_JOIN_TIMEOUT_S):
            log.warning("rank %d: the parent is not reading; joining anyway", rank)
        if self._stop.is_set():
            return None
        started = time.monotonic()
        try:
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
        self._use(engine, job)
        log.info("rank %d: model %s loaded (%s)", link.rank, job.model_dir, job.shard)
        self._status(RunnerReady())

    def _lead(self, link: GroupLink, idle_tick: float) -> None:
        """Rank 0: gather what joins and leaves the batch, share it, step with everyone.

        With nothing running it waits up to `idle_tick` for a request, and shares an idle
        step even if none came, so every rank's wait stays short (see `StallWatch`)."""
        assert self._batch is not None
        while True:
            idle = not self._batch
            if idle:
                self.watch.rest()
            jobs = self._next_jobs(block=idle, timeout=idle_tick)
            if self._hooks.stop_check_delay:
                time.sleep(self._hooks.stop_check_delay)
            start = []
            for job in jobs:
                if isinstance(job, LoadModel):
                    log.warning("already serving a rank group: ignoring a second LoadModel")
                elif self._should_stop(job.request_id):  # cancelled while queued
                    never_run = Usage(0, 0)
                    self._send_chunk(
                        Chunk(job.request_id, "", finish_reason="cancelled", usage=never_run)
                    )
                    self._forget(job.request_id)
                else:
                    start.append(_seeded(job))
            with self._lock:
                cancelled = tuple(sorted(rid for rid in self._cancelled if rid in self._batch))
            step = GroupStep(tuple(start), cancelled)
            self._group_step(link, self._share_step(link, step))

    def _follow(self, link: GroupLink) -> None:
        """Rank > 0: do what rank 0 shares, until the group ends."""
        while True:
            self._group_step(link, self._share_step(link, GroupStep()))

    def _share_step(self, link: GroupLink, step: GroupStep) -> GroupStep:
        """Rank 0's `step`, on every rank; `_GroupEnding` if a rank is leaving."""
        from trexo.engine.sharding import GroupBroken

        data, leaving = link.share_bytes(encode_step(step), leaving=self._stop.is_set())
        if leaving:
            for request in step.start:  # rank 0's, taken from its queue but never started
                self._post(RequestFailed(request.request_id, GROUP_ENDING, GROUP_FAILURE))
                self._forget(request.request_id)
            raise _GroupEnding
        try:
            return decode_step(data)
        except StepUndecodable as exc:
            raise GroupBroken(f"rank 0 shared an undecodable step: {exc}") from exc

    def _group_step(self, link: GroupLink, step: GroupStep) -> None:
        """Apply rank 0's joins and leaves, then one step of the batch, as every rank does.

        A refused request is refused on every rank alike (the same check of the same
        prompt). Any other failure leaves this rank out of step with the others: the group
        is broken, and every request in flight fails with it.
        """
        from trexo.engine.sharding import GroupBroken

        assert self._batch is not None
        lead = link.is_lead
        try:
            for request in step.start:
                self._add_shared(request, lead)
            for rid in step.cancel:
                final = self._batch.remove(rid)
                if lead and final is not None:
                    self._send_chunk(final)
                    self._finished(rid)
            if not self._batch:
                return
            chunks = self._batch.step()
            if lead:
                self._deliver(chunks)
            if self._hooks.step_delay and self._batch:
                time.sleep(self._hooks.step_delay)
        except (_GroupEnding, GroupBroken):
            raise
        except Exception as exc:
            # A rank that failed alone is out of step with the others: the group is broken.
            log.exception("rank %d: a generation step failed", link.rank)
            raise GroupBroken(f"{type(exc).__name__}: {exc}") from exc

    def _add_shared(self, request: GenerationRequest, lead: bool) -> None:
        """Add what rank 0 shared, as every rank does: whatever happened since (a cancel is
        the next step's), so that every rank's batch stays the same. A request that cannot
        be served is refused alike on every rank (the same check of the same prompt); rank
        0 says so."""
        assert self._engine is not None and self._batch is not None
        rid = request.request_id
        try:
            self._batch.add(*self._engine.admit(request))
        except ValueError as exc:
            if lead:
                log.info("generation %s refused: %s", rid, exc)
                self._post(RequestFailed(rid, str(exc), FailureKind.INVALID_REQUEST))
                self._forget(rid)
            return
        if lead:
            self._status(RunnerRunning(len(self._batch)))

    def _fail_all(self, message: str) -> None:
        """Rank 0: every generation queued or in flight fails with `message`, retryably."""
        if self.rank:
            return
        for rid in self.active_requests():
            self._post(RequestFailed(rid, message, GROUP_FAILURE))
            self._forget(rid)


def _seeded(request: GenerationRequest) -> GenerationRequest:
    if request.params.seed is not None:
        return request
    params = attrs.evolve(request.params, seed=random.getrandbits(SEED_BITS))
    return attrs.evolve(request, params=params)
