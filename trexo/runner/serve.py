"""The runner's trio side: read frames from the parent, feed the compute thread, send results.

EOF on the socket means the parent is gone or done with us: stop computing, join the
compute thread (bounded), exit. No watchdog polls for the parent. A rank of a split model
also ends when its group breaks (the compute thread's loop ends by itself), and a watchdog
ends it hard when it has waited on its peers longer than the stall timeout: a frozen peer
never makes a collective fail, so only a clock can tell.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable

import trio

from trexo.config import COMPUTE_JOIN_TIMEOUT_S, MAX_FRAME_BYTES
from trexo.errors import WireError
from trexo.local_health import LocalHealth, machine_load_stretch
from trexo.runner.compute import GROUP_FAILURE, ComputeThread
from trexo.runner.exit_codes import (
    EXIT_COMPUTE_STUCK,
    EXIT_GROUP_STALLED,
    EXIT_OK,
    EXIT_PROTOCOL_ERROR,
)
from trexo.runner.hooks import TestHooks
from trexo.runner.schema_gate import SchemaGate
from trexo.schema_guard import SchemaGuard
from trexo.types.ipc import (
    Cancel,
    FromRunner,
    Generate,
    LoadModel,
    RequestFailed,
    Shutdown,
    StatusReport,
    ToRunner,
)
from trexo.types.runner_status import RunnerReady
from trexo.wire import FramedStream

log = logging.getLogger(__name__)

FLUSH_TIMEOUT_S = 1.0
"""On the way out, how long to keep sending results the parent has not read yet."""
GARBAGE_FRAME = b"\xff this is not a message"
_Outgoing = FromRunner | threading.Event
"""A message for the parent, or a marker the writer sets once it has sent what came before."""
STALL_CHECK_INTERVAL_S = 0.1
"""How often the watchdog looks at the compute thread's wait on its peers."""
STALL_REPORT_TIMEOUT_S = 0.5
"""How long a stalled rank 0 waits for its failed requests to reach the parent."""


async def serve_runner(
    sock: socket.socket,
    *,
    hooks: TestHooks = TestHooks(),
    max_frame_bytes: int = MAX_FRAME_BYTES,
    compute_join_timeout: float = COMPUTE_JOIN_TIMEOUT_S,
    schema_guard: SchemaGuard | None = None,
) -> int:
    """Serve the parent on `sock` until Shutdown, EOF or a protocol error; the exit code.

    `schema_guard` checks requests' JSON schemas before they reach the compute thread."""
    stream = FramedStream(trio.SocketStream(trio.socket.from_stdlib_socket(sock)), max_frame_bytes)
    outbox_send, outbox_receive = trio.open_memory_channel[_Outgoing](math.inf)
    token = trio.lowlevel.current_trio_token()

    def deliver(item: _Outgoing) -> None:
        # Closed means we are leaving: the parent no longer wants results.
        with contextlib.suppress(trio.ClosedResourceError):
            outbox_send.send_nowait(item)
            return
        if isinstance(item, threading.Event):
            item.set()  # nothing more will be sent

    def post(item: _Outgoing) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(deliver, item)

    def drain(timeout: float) -> bool:
        sent = threading.Event()
        post(sent)  # the writer sets it once everything posted before it has been sent
        return sent.wait(timeout)

    compute_ended = trio.Event()

    def on_compute_end() -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(compute_ended.set)

    compute = ComputeThread(post, hooks, on_end=on_compute_end, drain=drain)
    exit_code = EXIT_OK
    async with trio.open_nursery() as nursery:
        writer_done = trio.Event()
        nursery.start_soon(_write_loop, stream, outbox_receive, hooks, writer_done)
        nursery.start_soon(_watch_for_stalls, compute, post, drain)
        compute.start()
        try:
            with trio.CancelScope() as serving:
                nursery.start_soon(_cancel_when_set, compute_ended, serving)
                gate = SchemaGate(schema_guard or SchemaGuard(), compute, post, nursery)
                await _read_loop(stream, compute, gate, hooks)
        except WireError as exc:
            log.error("protocol error from parent: %s; exiting", exc)
            exit_code = EXIT_PROTOCOL_ERROR
        finally:
            compute.request_stop()
            if compute.loading:
                # Imports, `mx.distributed.init` or reading weights: it cannot stop until
                # done, and nothing of it is wanted now. Leave at once: its group and its
                # memory are freed now, not after the join's timeout.
                log.info("stopped while loading a model; exiting at once")
                _exit_hard(exit_code)
            with trio.CancelScope(shield=True):
                joined = await trio.to_thread.run_sync(compute.join, compute_join_timeout)
                if not joined:
                    # An exiting process with a live MLX thread aborts (exit -6): leave now.
                    log.error(
                        "compute thread still busy after %.1f s; exiting hard", compute_join_timeout
                    )
                    _exit_hard(EXIT_COMPUTE_STUCK)
                if compute.exit_code is not None and exit_code == EXIT_OK:
                    exit_code = compute.exit_code  # it ended by itself: the group broke
                outbox_send.close()
                with trio.move_on_after(FLUSH_TIMEOUT_S):
                    await writer_done.wait()
            nursery.cancel_scope.cancel()
    return exit_code


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _watch_for_stalls(
    compute: ComputeThread, post: Callable[[FromRunner], None], drain: Callable[[float], bool]
) -> None:
    """Exit hard once the compute thread has waited on its peers past the stall timeout,
    stretched while this process itself runs late and while the machine is busy (both slow
    every rank's steps; `trexo.local_health`).

    A frozen peer makes no collective fail, and after the ring gave up on a dead peer a
    collective queued behind the failed one neither completes nor raises: only this ends
    such a rank. Rank 0 first fails its requests, so that their clients learn why.
    """
    health = LocalHealth()
    while True:
        due = time.monotonic() + STALL_CHECK_INTERVAL_S
        await trio.sleep(STALL_CHECK_INTERVAL_S)
        now = time.monotonic()
        health.observe(now, now - due)  # this process starved of CPU: so may its peers be
        waited = compute.stalled_for(now, stretch=health.multiplier(now))
        if waited is None:
            continue
        # Past the bound: unless the whole machine is busy (then so are the peers, whose
        # steps this rank waits on), the group is stalled.
        stretch = health.multiplier(now) * machine_load_stretch()
        if compute.stalled_for(now, stretch=stretch) is None:
            continue
        bound = compute.stall_timeout * stretch
        log.error(
            "rank %s: group stalled, %.1f s in one collective (bound %.1f s); exiting",
            compute.rank,
            waited,
            bound,
        )
        message = f"rank group stalled: no word from the other ranks for {waited:.1f} s"
        for request_id in compute.active_requests():
            post(RequestFailed(request_id, message, GROUP_FAILURE))
        await trio.to_thread.run_sync(drain, STALL_REPORT_TIMEOUT_S)
        _exit_hard(EXIT_GROUP_STALLED)


def _exit_hard(code: int) -> None:
    """Leave at once: joining a compute thread stuck in MLX would wait forever."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)


async def _read_loop(
    stream: FramedStream, compute: ComputeThread, gate: SchemaGate, hooks: TestHooks
) -> None:
    while True:
        try:
            msg: ToRunner = await stream.receive_message(ToRunner)
        except (trio.EndOfChannel, trio.BrokenResourceError):
            if hooks.ignore_shutdown:
                log.warning("test hook: ignoring EOF from parent")
                await trio.sleep_forever()
            log.info("parent closed the IPC socket; exiting")
            return
        match msg:
            case LoadModel():
                compute.submit_load(msg)
            case Generate(request=request):
                gate.submit(request)
            case Cancel(request_id=request_id):
                gate.cancel(request_id)
            case Shutdown():
                if hooks.ignore_shutdown:
                    log.warning("test hook: ignoring Shutdown")
                    continue
                log.info("shutdown requested by parent")
                return


async def _write_loop(
    stream: FramedStream,
    outbox: trio.MemoryReceiveChannel[_Outgoing],
    hooks: TestHooks,
    done: trio.Event,
) -> None:
    try:
        async with outbox:
            async for msg in outbox:
                if isinstance(msg, threading.Event):
                    msg.set()
                    continue
                await stream.send_message(msg, FromRunner)
                if hooks.garbage_after_ready and msg == StatusReport(RunnerReady()):
                    log.warning("test hook: sending a garbage frame")
                    await stream.send_frame(GARBAGE_FRAME)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        log.info("parent stopped reading; dropping remaining results")
    finally:
        done.set()
