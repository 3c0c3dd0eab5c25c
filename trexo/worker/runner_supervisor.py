"""The parent side of one runner process: spawn, talk, stop, reap.

`RunnerSupervisor.run` is a service (README, Architecture): it spawns the runner as a child
of its own nursery, returns only once the process has been reaped, and stops it, when
cancelled, with the ladder Shutdown -> grace -> SIGTERM -> grace -> SIGKILL, each step bounded by
`RunnerConfig`. How the process ended is kept in `exit_cause`.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import attrs
import trio

from trexo.config import CANCEL_SEND_TIMEOUT_S, RunnerConfig
from trexo.errors import (
    LoadFailed,
    RequestRejected,
    RunnerDied,
    RunnerError,
    RunnerUnavailable,
    WireError,
)
from trexo.local_health import machine_load_stretch
from trexo.progress import Silent, process_effort, wait_while_progressing
from trexo.runner.exit_codes import describe_exit
from trexo.types.chunks import Chunk
from trexo.types.failure import FailureKind
from trexo.types.generation import GenerationRequest
from trexo.types.ids import RequestId, RunnerId
from trexo.types.ipc import (
    CacheReport,
    Cancel,
    ChunkBatch,
    ChunkMessage,
    FromRunner,
    Generate,
    GroupJoined,
    JoiningGroup,
    LoadModel,
    PromptCacheStats,
    RequestFailed,
    Shutdown,
    StatusReport,
    ToRunner,
)
from trexo.types.runner_status import (
    TERMINAL_STATUSES,
    RunnerFailed,
    RunnerIdle,
    RunnerReady,
    RunnerStatus,
    RunnerStopped,
)
from trexo.types.shard import RankGroup, ShardSpec
from trexo.wire import FramedStream

log = logging.getLogger(__name__)

OUTPUT_DRAIN_TIMEOUT_S = 1.0
"""After a stop, how long to keep copying the runner's last output lines."""
StatusListener = Callable[[RunnerStatus], None]
RUNNER_HUNG_UP = "runner closed the IPC socket"


@attrs.frozen
class _Failure:
    """Put in a request's chunk channel instead of a chunk: the request ended in error."""

    error: RunnerError


def _request_error(kind: FailureKind, message: str) -> RunnerError:
    if kind is FailureKind.INVALID_REQUEST:
        return RequestRejected(message)
    if kind is FailureKind.UNAVAILABLE:  # e.g. its rank group broke: retry once rebuilt
        return RunnerUnavailable(message)
    return RunnerError(message)


def runner_command(ipc_fd: int, runner_id: str, config: RunnerConfig) -> list[str]:
    """The argv that starts a runner process with its IPC socket on `ipc_fd`."""
    return [
        sys.executable,
        "-m",
        "trexo.runner",
        "--ipc-fd",
        str(ipc_fd),
        "--runner-id",
        runner_id,
        "--max-frame-bytes",
        str(config.max_frame_bytes),
        "--compute-join-timeout",
        str(config.compute_join_timeout),
    ]


class ChunkStream:
    """One request's chunks, in order. Iteration ends after the final chunk.

    Raises `RunnerError` if the runner reports the request failed, or `RunnerDied` if the
    runner exited before the request finished.
    """

    def __init__(self, receive: trio.MemoryReceiveChannel[Chunk | _Failure]) -> None:
        self._receive = receive
        self.finished = False

    def __aiter__(self) -> ChunkStream:
        return self

    async def __anext__(self) -> Chunk:
        if self.finished:
            raise StopAsyncIteration
        try:
            item = await self._receive.receive()
        except trio.EndOfChannel:
            self.finished = True
            raise StopAsyncIteration from None
        if isinstance(item, _Failure):
            self.finished = True
            raise item.error
        if item.finish_reason is not None:
            self.finished = True
        return item


class RunnerSupervisor:
    """Owns one runner process. Start with `await nursery.start(supervisor.run)`."""

    def __init__(
        self,
        runner_id: RunnerId,
        *,
        config: RunnerConfig = RunnerConfig(),
        log_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        on_status: StatusListener | None = None,
        command: Callable[[int, str, RunnerConfig], Sequence[str]] = runner_command,
    ) -> None:
        self.runner_id = runner_id
        self.config = config
        self.log_path = log_dir / f"{runner_id}.log" if log_dir else None
        self._extra_env = dict(env or {})
        self._on_status = on_status
        self._command = command
        self.status: RunnerStatus = RunnerIdle()
        self.exit_cause: str | None = None
        """How the process ended ("SIGKILL", "exit code 0 (clean exit)", ...), once reaped."""
        self.stop_step: str | None = None
        """Which step of the stop ladder ended the process, if the ladder ran."""
        self.pid: int | None = None
        self.joining_group: JoiningGroup | None = None
        """Set when the rank's own start-up is done and it connects to its peers."""
        self.joined_group: GroupJoined | None = None
        self.prompt_cache = PromptCacheStats()
        """The runner's prompt cache, as it last reported it."""
        """Set once the runner has joined its rank group (a split model's rank only)."""
        self._status_changed = trio.Event()
        self._inflight: dict[RequestId, trio.MemorySendChannel[Chunk | _Failure]] = {}
        self._stream: FramedStream | None = None
        self._process: trio.Process | None = None
        self._end_reason: str | None = None  # set when the runner's side ended the link

    # --- the service -------------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[RunnerSupervisor] = trio.TASK_STATUS_IGNORED
    ) -> None:
        # A spawn that fails (no file descriptor left, say) is this runner's failure, not
        # its owner's crash: the status says why, and the owner's retry policy decides.
        try:
            parent_end, child_end = socket.socketpair()
        except OSError as exc:
            self._end_reason = f"could not start: {exc}"
            self._finish(stopped_by_owner=False)
            task_status.started(self)
            return
        try:
            self._stream = FramedStream(
                trio.SocketStream(trio.socket.from_stdlib_socket(parent_end)),
                self.config.max_frame_bytes,
            )
            async with trio.open_nursery() as nursery:
                process_scope = trio.CancelScope()
                try:
                    process: trio.Process = await nursery.start(
                        self._run_process, child_end.fileno(), process_scope
                    )
                except OSError as exc:
                    self._end_reason = f"could not start: {exc}"  # `_finish` reports it
                    task_status.started(self)
                    return
                child_end.close()  # only the runner may hold it: its exit must mean EOF
                self._process = process
                self.pid = process.pid
                log.info("runner %s started (pid %d)", self.runner_id, process.pid)
                assert process.stdout is not None
                nursery.start_soon(self._forward_output, process.stdout)
                task_status.started(self)
                await self._read_messages(self._stream)
                # The runner closed its end or spoke garbage: make sure it goes.
                process_scope.cancel()
        finally:
            child_end.close()
            parent_end.close()
            # The reader did not see the runner end the link: our owner stopped us.
            self._finish(stopped_by_owner=self._end_reason is None)

    async def _run_process(
        self,
        ipc_fd: int,
        scope: trio.CancelScope,
        *,
        task_status: trio.TaskStatus[trio.Process],
    ) -> None:
        env = {
            **os.environ,
            "OPENBLAS_NUM_THREADS": str(self.config.openblas_threads),
            "PYTHONUNBUFFERED": "1",
            **self._extra_env,
        }
        with scope:
            await trio.run_process(
                list(self._command(ipc_fd, self.runner_id, self.config)),
                pass_fds=(ipc_fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                check=False,
                deliver_cancel=self._stop_ladder,
                task_status=task_status,
            )

    async def _stop_ladder(self, process: trio.Process) -> None:
        """Shutdown, then SIGTERM, then SIGKILL; runs shielded inside `trio.run_process`."""
        started = trio.current_time()
        if self._end_reason == RUNNER_HUNG_UP:
            # Its socket closed: it died or is leaving by itself (the kernel closes a dying
            # process's files before its exit can be reaped). Nothing to stop unless it hangs.
            with trio.move_on_after(self.config.shutdown_grace):
                await process.wait()
                return  # `_finish` says how it ended
        if self.joining_group is not None and self.joined_group is None:
            # Inside `mx.distributed.init`, which holds the GIL until every peer is there:
            # it cannot read a Shutdown, and has nothing to clean up. Waiting out the grace
            # would keep the rest of its group (and their memory) for seconds.
            log.info("runner %s is joining its group: SIGTERM at once", self.runner_id)
        else:
            with trio.move_on_after(self.config.shutdown_grace):
                await self._send_quietly(Shutdown())
                await process.wait()
                self.stop_step = "shutdown"
            if process.returncode is None:
                log.warning("runner %s ignored shutdown; sending SIGTERM", self.runner_id)
        if process.returncode is None:
            process.terminate()
            with trio.move_on_after(self.config.term_grace):
                await process.wait()
                self.stop_step = "SIGTERM"
        if process.returncode is None:
            log.warning("runner %s ignored SIGTERM; sending SIGKILL", self.runner_id)
            process.kill()
            with trio.move_on_after(self.config.kill_grace):
                await process.wait()
                self.stop_step = "SIGKILL"
        log.info(
            "runner %s stopped by %s in %.3f s",
            self.runner_id,
            self.stop_step or "nothing (still running!)",
            trio.current_time() - started,
        )

    async def _send_quietly(self, msg: ToRunner) -> None:
        """Send if the link still works; a dead runner is handled by the reaper, not here."""
        if self._stream is None:
            return
        with suppress(trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            await self._stream.send_message(msg, ToRunner)

    async def _read_messages(self, stream: FramedStream) -> None:
        while True:
            try:
                msg: FromRunner = await stream.receive_message(FromRunner)
            except (trio.EndOfChannel, trio.BrokenResourceError):
                self._end_reason = RUNNER_HUNG_UP
                return
            except WireError as exc:
                log.error("protocol error from runner %s: %s; stopping it", self.runner_id, exc)
                self._end_reason = f"protocol error: {exc}"
                return
            self._dispatch(msg)

    def _dispatch(self, msg: FromRunner) -> None:
        match msg:
            case StatusReport(status=status):
                self._set_status(status)
            case JoiningGroup():
                self.joining_group = msg
                self._notify()
            case GroupJoined():
                self.joined_group = msg
                self._notify()
            case CacheReport(stats=stats):
                self.prompt_cache = stats
            case ChunkMessage(chunk=chunk):
                self._route(chunk)
            case ChunkBatch(chunks=chunks):
                for chunk in chunks:
                    self._route(chunk)
            case RequestFailed(request_id=request_id, message=message, kind=kind):
                channel = self._inflight.pop(request_id, None)
                if channel is not None:
                    channel.send_nowait(_Failure(_request_error(kind, message)))
                    channel.close()

    def _route(self, chunk: Chunk) -> None:
        channel = self._inflight.get(chunk.request_id)
        if channel is None:
            return  # its consumer left; the runner was told to cancel it
        channel.send_nowait(chunk)
        if chunk.finish_reason is not None:
            del self._inflight[chunk.request_id]
            channel.close()

    def _finish(self, stopped_by_owner: bool) -> None:
        """After the process is reaped: record how it ended, fail what was in flight."""
        returncode = self._process.returncode if self._process else None
        cause = describe_exit(returncode) if returncode is not None else "never started"
        if self._end_reason and self._end_reason.startswith("protocol error"):
            cause = f"{self._end_reason} ({cause})"
        elif self._end_reason and self._end_reason.startswith("could not start"):
            cause = self._end_reason
        self.exit_cause = cause
        for channel in self._inflight.values():
            channel.send_nowait(_Failure(RunnerDied(cause)))
            channel.close()
        self._inflight.clear()
        if stopped_by_owner:
            self._set_status(RunnerStopped(cause))
        else:
            log.error("runner %s ended unexpectedly: %s", self.runner_id, cause)
            self._set_status(RunnerFailed(cause))

    # --- output -----------------------------------------------------------------------------

    async def _forward_output(self, stdout: trio.abc.ReceiveStream) -> None:
        """Copy the runner's output to its log file and to the node log, line by line."""
        forwarder = _LineForwarder(self.runner_id, self.log_path)
        try:
            await forwarder.copy(stdout)
        except trio.Cancelled:
            # The process is being stopped: keep its last words, for a bounded time.
            with trio.CancelScope(shield=True), trio.move_on_after(OUTPUT_DRAIN_TIMEOUT_S):
                await forwarder.copy(stdout)
            raise
        finally:
            await forwarder.aclose()

    # --- status ------------------------------------------------------------------------------

    def _set_status(self, status: RunnerStatus) -> None:
        if isinstance(self.status, TERMINAL_STATUSES):
            return
        self.status = status
        self._notify()
        if self._on_status is not None:
            self._on_status(status)

    def _notify(self) -> None:
        """Wake whoever waits for a status (or the group join) to change."""
        self._status_changed.set()
        self._status_changed = trio.Event()

    async def wait_status(self, predicate: Callable[[RunnerStatus], bool]) -> RunnerStatus:
        """Wait until the status satisfies `predicate` (or is terminal); return it."""
        while not (predicate(self.status) or isinstance(self.status, TERMINAL_STATUSES)):
            await self._status_changed.wait()
        return self.status

    # --- requests ---------------------------------------------------------------------------

    async def load(
        self, model_dir: Path, shard: ShardSpec = ShardSpec(), group: RankGroup | None = None
    ) -> None:
        """Load and warm up a model; raise `LoadFailed` unless the runner becomes ready.

        With `group`, the runner is rank `shard.rank` of a split model: once started, it
        must join the group within `config.group_init_timeout` (every rank's runner loads
        at the same time, rank 0's first), then load its part for as long as it makes progress
        (`config.load_silence` bounds a silence, not the load). A runner
        that fails to join is stuck in `mx.distributed.init`: stop it (cancel `run`).
        """
        config = self.config
        # Every rank of a group starts at once: on a busy machine their start-ups and the
        # ring's connection take longer, and this rank's bound on them stretches.
        init_timeout = round(config.group_init_timeout * machine_load_stretch(), 1)
        await self._send(
            LoadModel(
                str(model_dir),
                shard,
                config.prefill_step,
                group=group,
                group_init_timeout=init_timeout,
                group_stall_timeout=config.group_stall_timeout,
                group_idle_tick=config.group_idle_tick,
                max_batch=config.max_batch,
                prompt_cache_bytes=config.prompt_cache_bytes,
            )
        )
        if group is not None:
            await self._wait_joined(shard, group, init_timeout)
        status = await self._wait_progressing(lambda s: isinstance(s, RunnerReady), "loading")
        if not isinstance(status, RunnerReady):
            cause = getattr(status, "cause", repr(status))
            permanent = isinstance(status, RunnerFailed) and status.permanent
            raise LoadFailed(f"runner {self.runner_id}: {cause}", permanent=permanent)

    async def _wait_joined(self, shard: ShardSpec, group: RankGroup, join_bound: float) -> None:
        """Wait for the rank to join its group: its own start-up (imports, seconds on a busy
        machine) bounded by its silence (`load_silence`), then the connection to its peers by
        `join_bound` (`group_init_timeout`, stretched on a busy machine)."""
        ranks = len(group.hosts)
        await self._wait_progressing(
            lambda s: self.joining_group is not None or self.joined_group is not None,
            f"starting rank {shard.rank} of {ranks}",
        )
        self._raise_if_ended()
        with trio.move_on_after(join_bound):
            await self.wait_status(
                lambda s: self.joined_group is not None or isinstance(s, TERMINAL_STATUSES)
            )
        if self.joined_group is not None:
            return
        self._raise_if_ended()
        raise LoadFailed(
            f"rank {shard.rank} of {ranks} did not join its group within "
            f"{join_bound} s of starting to connect (hosts {', '.join(group.hosts)})"
        )

    async def _wait_progressing(
        self, predicate: Callable[[RunnerStatus], bool], what: str
    ) -> RunnerStatus:
        """`wait_status(predicate)` (or an ended runner's status) for as long as the runner
        process keeps making progress: `LoadFailed` after `load_silence` s without any."""
        pid = self.pid
        silence = self.config.load_silence
        try:
            return await wait_while_progressing(
                lambda: self.wait_status(predicate),
                lambda: process_effort(pid) if pid is not None else None,
                silence=silence,
            )
        except Silent:
            raise LoadFailed(
                f"runner {self.runner_id}: {what}: no progress (CPU time or reads)"
                f" for {silence:.0f} s"
            ) from None

    def _raise_if_ended(self) -> None:
        if isinstance(self.status, TERMINAL_STATUSES):
            cause = getattr(self.status, "cause", repr(self.status))
            raise LoadFailed(f"runner {self.runner_id}: {cause}")

    @asynccontextmanager
    async def open_generation(self, request: GenerationRequest) -> AsyncIterator[ChunkStream]:
        """Start a generation; leaving the block before it finished cancels it in the runner."""
        if isinstance(self.status, TERMINAL_STATUSES):
            raise RunnerUnavailable(f"runner {self.runner_id} is down ({self.status})")
        if request.request_id in self._inflight:
            raise RunnerError(
                f"runner {self.runner_id} cannot take {request.request_id}: {self.status}"
            )
        send, receive = trio.open_memory_channel[Chunk | _Failure](math.inf)
        self._inflight[request.request_id] = send
        stream = ChunkStream(receive)
        try:
            await self._send(Generate(request))
            yield stream
        finally:
            receive.close()
            if self._inflight.pop(request.request_id, None) is not None:
                send.close()
                with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_SEND_TIMEOUT_S):
                    await self._send_quietly(Cancel(request.request_id))

    async def cancel(self, request_id: RequestId) -> None:
        """Ask the runner to stop a generation; its stream ends with finish reason "cancelled"."""
        await self._send_quietly(Cancel(request_id))

    async def _send(self, msg: ToRunner) -> None:
        if self._stream is None or isinstance(self.status, TERMINAL_STATUSES):
            raise RunnerUnavailable(f"runner {self.runner_id} is not running ({self.status})")
        try:
            await self._stream.send_message(msg, ToRunner)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise RunnerUnavailable(
                f"runner {self.runner_id} is gone (its IPC socket closed)"
            ) from exc


class _LineForwarder:
    """Splits a byte stream into lines for the runner's log file and the node log."""

    def __init__(self, runner_id: str, log_path: Path | None) -> None:
        self._log = logging.getLogger(f"trexo.runner.{runner_id[:8]}")
        self._prefix = f"[runner {runner_id[:8]}] "
        self._log_path = log_path
        self._file: Any = None
        self._partial = b""

    async def copy(self, stream: trio.abc.ReceiveStream) -> None:
        if self._log_path is not None and self._file is None:
            try:
                await trio.Path(self._log_path.parent).mkdir(parents=True, exist_ok=True)
                self._file = await trio.open_file(self._log_path, "ab", buffering=0)
            except OSError as exc:  # e.g. out of file descriptors: the node log still has it
                self._log.warning("%scannot open %s: %s", self._prefix, self._log_path, exc)
                self._log_path = None
        async for data in stream:
            if self._file is not None:
                await self._file.write(data)
            *lines, self._partial = (self._partial + data).split(b"\n")
            for line in lines:
                self._log.info("%s%s", self._prefix, line.decode(errors="replace"))

    async def aclose(self) -> None:
        if self._partial:
            self._log.info("%s%s", self._prefix, self._partial.decode(errors="replace"))
            self._partial = b""
        if self._file is not None:
            with trio.CancelScope(shield=True):
                await self._file.aclose()
            self._file = None
