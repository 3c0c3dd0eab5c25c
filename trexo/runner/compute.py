"""The runner's one compute thread: it owns the MLX engine and runs jobs in arrival order.

MLX streams belong to the OS thread that created them, so loading and every decode step run
on this single thread for the runner's whole life. The trio side talks to it through a
queue (jobs in) and a `post` callback (messages out); a stop flag is checked between steps.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trexo.runner.hooks import TestHooks
from trexo.types.chunks import Chunk, Usage
from trexo.types.failure import FailureKind
from trexo.types.generation import GenerationRequest
from trexo.types.ids import RequestId
from trexo.types.ipc import ChunkMessage, FromRunner, LoadModel, RequestFailed, StatusReport
from trexo.types.runner_status import (
    RunnerFailed,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerStatus,
)

if TYPE_CHECKING:
    from trexo.engine.engine import Engine

log = logging.getLogger(__name__)

Job = LoadModel | GenerationRequest


class ComputeThread:
    """Owns the engine. `post` must be safe to call from this thread (see `runner.serve`)."""

    def __init__(self, post: Callable[[FromRunner], None], hooks: TestHooks = TestHooks()) -> None:
        self._post = post
        self._hooks = hooks
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pending: set[RequestId] = set()  # queued or running generations
        self._cancelled: set[RequestId] = set()
        self._engine: Engine | None = None
        self._thread = threading.Thread(target=self._loop, name="trexo-compute")

    # --- called from the trio thread -------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit_load(self, msg: LoadModel) -> None:
        self._jobs.put(msg)

    def submit_generate(self, request: GenerationRequest) -> None:
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

    # --- the compute thread ---------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            job = self._jobs.get()
            if job is None:
                break
            if isinstance(job, LoadModel):
                self._load(job)
            else:
                self._generate(job)
        self._engine = None  # drop the model's arrays on this thread

    def _status(self, status: RunnerStatus) -> None:
        self._post(StatusReport(status))

    def _load(self, job: LoadModel) -> None:
        self._status(RunnerLoading(0.0))
        if self._hooks.load_delay:
            time.sleep(self._hooks.load_delay)
        try:
            from trexo.engine.engine import Engine  # mlx is imported here, after BLAS setup

            engine = Engine.load(
                Path(job.model_dir),
                job.shard,
                on_progress=lambda progress: self._status(RunnerLoading(progress)),
                prefill_step=job.prefill_step,
            )
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
            with self._lock:
                self._pending.discard(rid)
                self._cancelled.discard(rid)
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
