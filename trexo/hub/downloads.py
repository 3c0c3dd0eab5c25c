"""The node's model downloads: node-lifetime, so a master failover neither restarts nor blocks them.

`await downloads.fetch(model, shard)` returns the snapshot directory once it holds what the
runner of `shard` needs. A model whose files are on disk already costs a look at the cache.
Otherwise a download job runs in this service's nursery, in a download process
(`trexo.hub.worker`; one that finished a job waits for the next, so its start is paid
once): callers that want the same model and shard share the job; when the last of them
stops waiting (its instance was deleted) the process is ended at once, and what it fetched
stays for the next job to resume. Jobs of one repository run one at a time. A failure that
may pass (network down) is retried with backoff for as long as someone waits; one that
cannot (unknown repo, gated, no disk space, offline, a hub answering what no hub would) is
raised; content that differs from its listing, or a download process that died, is retried
a few times in a row (`gives_up`), then raised.

Progress goes out as `DownloadReport` facts on `facts` (the session's Worker sends them to
the master), at most every `report_interval` seconds and at every change of phase.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import attrs
import trio

from trexo import thread_pools, wire
from trexo.config import MAX_FRAME_BYTES, HubConfig
from trexo.errors import HUB_ERRORS, DownloadCrashed, HubError, HubUnreachable, MalformedMessage
from trexo.hub.cache import RepoCache
from trexo.hub.local import has_everything
from trexo.hub.meter import RateMeter
from trexo.hub.names import check_revision
from trexo.types.downloads import DownloadPhase, DownloadProgress
from trexo.types.fetch import (
    FetchDone,
    FetchEvent,
    FetchFailed,
    FetchJob,
    FetchPlanned,
    FetchProgress,
)
from trexo.types.ids import NodeId
from trexo.types.local_events import DownloadReport, LocalEvent
from trexo.types.models import HubRevision, ModelRef
from trexo.types.shard import ShardSpec

log = logging.getLogger(__name__)

WORKER_MODULE = "trexo.hub.worker"
DOWNLOAD_LOG = "downloads.log"


@attrs.define(eq=False)
class _Job:
    model: ModelRef
    revision: HubRevision
    shard: ShardSpec | None
    done: trio.Event = attrs.field(factory=trio.Event)
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    waiters: int = 0
    snapshot: Path | None = None
    error: HubError | None = None


def gives_up(error: HubError, failures: int, limit: int) -> bool:
    """Whether a download stops at `error`, its job's `failures`-th retryable failure other
    than an unreachable hub. Permanent errors stop it at once; an unreachable hub never does
    (retried with backoff for as long as someone waits); corrupt content or a dead download
    process after `limit` of them: a dropped connection is resumed within one attempt, so
    content wrong again and again is a hub sending the wrong bytes."""
    if not error.retryable:
        return True
    if isinstance(error, HubUnreachable):
        return False
    return failures >= limit


class Downloads:
    """Start with `await nursery.start(downloads.run)`; it returns itself once ready."""

    def __init__(self, node_id: NodeId, config: HubConfig, *, log_dir: Path) -> None:
        self._node_id = node_id
        self._config = config
        self._log_dir = log_dir
        self._jobs: dict[tuple[str, ShardSpec | None], _Job] = {}
        self._repo_locks: dict[str, trio.Lock] = {}
        self._progress: dict[str, DownloadProgress] = {}
        self._reported_at: dict[str, float] = {}
        self._changed = trio.Event()
        self._facts_send, self.facts = trio.open_memory_channel[LocalEvent](math.inf)
        self._nursery: trio.Nursery | None = None
        self._idle: list[_Helper] = []
        """At most one download process waiting for a job, its start already paid."""

    @property
    def config(self) -> HubConfig:
        return self._config

    async def run(
        self, *, task_status: trio.TaskStatus[Downloads] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with self._facts_send, trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                task_status.started(self)
                await trio.sleep_forever()
            finally:
                self._nursery = None

    # --- what others read -----------------------------------------------------------------

    def progress(self, model_id: str) -> DownloadProgress | None:
        return self._progress.get(model_id)

    async def wait_change(self) -> None:
        """Until some download's progress changes."""
        await self._changed.wait()

    def facts_now(self) -> list[LocalEvent]:
        """Every download's latest progress, for a new master."""
        return [DownloadReport(self._node_id, p) for p in self._progress.values()]

    # --- fetching ---------------------------------------------------------------------------

    async def fetch(self, model: ModelRef, shard: ShardSpec | None = None) -> Path:
        """The snapshot directory of hub model `model`, once it holds what `shard` needs
        (None: the whole model). Raises the `HubError` that stopped the download."""
        revision = model.hub_revision
        if revision is None:
            raise ValueError(f"{model.model_id} is not a Hugging Face model ({model.source})")
        # A reference from a peer or a client: its names become paths, so they are checked
        # here, with a clear error, before anything is looked up or started.
        cache = RepoCache(self._config.cache_dir, revision.repo_id)
        check_revision(revision.commit)
        whole = shard or ShardSpec()
        if await thread_pools.run_sync("files", has_everything, cache, revision.commit, whole):
            return cache.snapshot(revision.commit)
        key = (model.source, shard)
        job = self._jobs.get(key)
        if job is None:
            job = _Job(model, revision, shard)
            self._jobs[key] = job
            if self._nursery is None:
                raise RuntimeError("the downloads service is not running")
            self._nursery.start_soon(self._run_job, job, key)
        job.waiters += 1
        try:
            await job.done.wait()
        finally:
            job.waiters -= 1
            if job.waiters == 0 and not job.done.is_set():
                log.info("nothing needs %s any more: download stopped", model.model_id)
                job.scope.cancel()
                del self._jobs[key]  # whoever asks next starts afresh (and resumes)
        if job.error is not None:
            raise job.error
        assert job.snapshot is not None
        return job.snapshot

    async def _run_job(self, job: _Job, key: tuple[str, ShardSpec | None]) -> None:
        model_id = job.model.model_id
        lock = self._repo_locks.setdefault(job.revision.repo_id, trio.Lock())
        try:
            with job.scope:
                async with lock:  # one job at a time writes into a repository's folder
                    await self._attempts(job)
            if job.scope.cancelled_caught:
                self._update(model_id, phase=DownloadPhase.CANCELLED, bytes_per_s=0.0, eta_s=None)
        finally:
            if self._jobs.get(key) is job:
                del self._jobs[key]
            job.done.set()

    async def _attempts(self, job: _Job) -> None:
        model_id = job.model.model_id
        attempt = failures = 0
        while True:
            self._update(model_id, phase=DownloadPhase.DOWNLOADING, error=None, retry_in=None)
            try:
                job.snapshot = await self._run_process(job)
            except HubError as exc:
                if not isinstance(exc, HubUnreachable):
                    failures += 1
                if gives_up(exc, failures, self._config.max_corrupt_attempts):
                    log.error("download of %s failed: %s", model_id, exc)
                    job.error = exc
                    self._update(
                        model_id, phase=DownloadPhase.FAILED, error=str(exc), bytes_per_s=0.0
                    )
                    return
                attempt += 1
                delay = self._config.retry_delay(attempt)
                log.warning("download of %s failed (%s); retrying in %.0f s", model_id, exc, delay)
                self._update(
                    model_id,
                    phase=DownloadPhase.RETRYING,
                    error=str(exc),
                    retry_in=delay,
                    bytes_per_s=0.0,
                    eta_s=None,
                )
                await trio.sleep(delay)
                continue
            current = self._progress[model_id]
            self._update(
                model_id,
                phase=DownloadPhase.DONE,
                done_bytes=current.total_bytes,
                bytes_per_s=0.0,
                eta_s=0.0,
            )
            log.info("%s is on disk (%s)", model_id, job.snapshot)
            return

    async def _run_process(self, job: _Job) -> Path:
        """Run `job` in an idle download process (or a new one); the snapshot directory."""
        config = self._config
        fetch = FetchJob(
            repo_id=job.revision.repo_id,
            revision=job.revision.commit,
            shard=job.shard,
            cache_dir=str(config.cache_dir),
            endpoint=config.endpoint,
            offline=config.offline,
            chunk_bytes=config.chunk_bytes,
            progress_interval=config.progress_interval,
            disk_margin=config.disk_margin,
            request_timeout=config.request_timeout,
            max_json_bytes=config.max_json_bytes,
        )
        helper = self._idle.pop() if self._idle else await self._start_helper()
        meter = RateMeter(config.rate_window)
        outcome: FetchDone | FetchFailed | None = None
        try:
            await helper.stdin.send_all(wire.to_json(fetch, FetchJob) + b"\n")
            while outcome is None and (line := await helper.lines.next()) is not None:
                event = _decode(line)
                if event is not None:
                    outcome = self._on_event(job.model.model_id, event, meter)
        except trio.BrokenResourceError:
            pass  # it died before it read the job: no outcome
        finally:
            # Mid-job (a cancel, a death): end it; nothing else may use it. Else keep one.
            if outcome is not None and not self._idle:
                self._idle.append(helper)
            else:
                helper.scope.cancel()
        match outcome:
            case FetchDone(snapshot=snapshot):
                return Path(snapshot)
            case FetchFailed(error=name, message=message):
                raise HUB_ERRORS.get(name, DownloadCrashed)(message)
        raise DownloadCrashed(
            f"the download process of {job.model.model_id} ended "
            f"({helper.process.returncode}) before it finished"
        )

    async def _start_helper(self) -> _Helper:
        if self._nursery is None:
            raise RuntimeError("the downloads service is not running")
        helper: _Helper = await self._nursery.start(self._keep_helper)
        return helper

    async def _keep_helper(self, *, task_status: trio.TaskStatus[_Helper]) -> None:
        """One download process, from its start until it ends (its scope is cancelled, or
        it exits at EOF on its stdin); always reaped."""
        self._log_dir.mkdir(parents=True, exist_ok=True)
        # huggingface_hub reads its endpoint from the environment when it is imported.
        env = {**os.environ, "HF_ENDPOINT": self._config.endpoint}
        with (
            trio.CancelScope() as scope,
            (self._log_dir / DOWNLOAD_LOG).open("ab") as stderr,
        ):
            async with trio.open_nursery() as nursery:
                process: trio.Process = await nursery.start(
                    partial(
                        trio.run_process,
                        [sys.executable, "-m", WORKER_MODULE],
                        # Jobs go in here. When this node dies the pipe closes, and the
                        # download process exits at that EOF: no orphan keeps fetching.
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=stderr,
                        env=env,
                        check=False,
                        deliver_cancel=self._stop_process,
                    )
                )
                assert process.stdin is not None and process.stdout is not None
                task_status.started(_Helper(process, process.stdin, _Lines(process.stdout), scope))

    async def _stop_process(self, process: trio.Process) -> None:
        process.terminate()
        with trio.move_on_after(self._config.stop_grace):
            await process.wait()
            return
        process.kill()

    def _on_event(
        self, model_id: str, event: FetchEvent, meter: RateMeter
    ) -> FetchDone | FetchFailed | None:
        now = trio.current_time()
        match event:
            case FetchPlanned(total_bytes=total, done_bytes=done):
                meter.record(now, done)
                self._update(model_id, total_bytes=total, done_bytes=done)
            case FetchProgress(done_bytes=done):
                meter.record(now, done)
                total = self._progress[model_id].total_bytes
                self._update(
                    model_id,
                    done_bytes=done,
                    bytes_per_s=meter.rate(),
                    eta_s=meter.eta(done, total),
                )
            case FetchDone() | FetchFailed():
                return event
        return None

    # --- progress -----------------------------------------------------------------------------

    def _update(self, model_id: str, **changes: object) -> None:
        current = self._progress.get(model_id) or DownloadProgress(
            model_id, DownloadPhase.DOWNLOADING
        )
        updated = attrs.evolve(current, **changes)  # type: ignore[arg-type]
        self._progress[model_id] = updated
        self._changed.set()
        self._changed = trio.Event()
        now = trio.current_time()
        moved_on = updated.phase != current.phase
        due = now - self._reported_at.get(model_id, -math.inf) >= self._config.report_interval
        if moved_on or due or model_id not in self._reported_at:
            self._reported_at[model_id] = now
            self._facts_send.send_nowait(DownloadReport(self._node_id, updated))


class _Lines:
    """Newline-ended lines of a byte stream; an overlong line is dropped."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    async def next(self) -> bytes | None:
        """The next line; None at EOF."""
        while (end := self._buffer.find(b"\n")) < 0:
            chunk = await self._stream.receive_some()
            if not chunk:
                return None
            self._buffer += chunk
            if len(self._buffer) > MAX_FRAME_BYTES:
                log.warning("download process wrote a line over %d bytes: dropped", MAX_FRAME_BYTES)
                self._buffer.clear()
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return line


@attrs.define(eq=False)
class _Helper:
    """A started download process, taking one job at a time."""

    process: trio.Process
    stdin: trio.abc.SendStream
    lines: _Lines
    scope: trio.CancelScope
    """Its owner's: cancelling it ends the process (SIGTERM, then SIGKILL)."""


def _decode(line: bytes) -> FetchEvent | None:
    try:
        event: FetchEvent = wire.from_json(line, FetchEvent)
    except MalformedMessage as exc:
        log.warning("download process said something unreadable (%s): dropped", exc)
        return None
    return event
