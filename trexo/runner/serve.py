"""The runner's trio side: read frames from the parent, feed the compute thread, send results.

EOF on the socket means the parent is gone or done with us: stop computing, join the
compute thread (bounded), exit. No watchdog polls for the parent.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket

import trio

from trexo.config import COMPUTE_JOIN_TIMEOUT_S, MAX_FRAME_BYTES
from trexo.errors import WireError
from trexo.runner.compute import ComputeThread
from trexo.runner.exit_codes import EXIT_COMPUTE_STUCK, EXIT_OK, EXIT_PROTOCOL_ERROR
from trexo.runner.hooks import TestHooks
from trexo.types.ipc import (
    Cancel,
    FromRunner,
    Generate,
    LoadModel,
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


async def serve_runner(
    sock: socket.socket,
    *,
    hooks: TestHooks = TestHooks(),
    max_frame_bytes: int = MAX_FRAME_BYTES,
    compute_join_timeout: float = COMPUTE_JOIN_TIMEOUT_S,
) -> int:
    """Serve the parent on `sock` until Shutdown, EOF or a protocol error; the exit code."""
    stream = FramedStream(trio.SocketStream(trio.socket.from_stdlib_socket(sock)), max_frame_bytes)
    outbox_send, outbox_receive = trio.open_memory_channel[FromRunner](math.inf)
    token = trio.lowlevel.current_trio_token()

    def deliver(msg: FromRunner) -> None:
        # Closed means we are leaving: the parent no longer wants results.
        with contextlib.suppress(trio.ClosedResourceError):
            outbox_send.send_nowait(msg)

    def post(msg: FromRunner) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(deliver, msg)

    compute = ComputeThread(post, hooks)
    exit_code = EXIT_OK
    async with trio.open_nursery() as nursery:
        writer_done = trio.Event()
        nursery.start_soon(_write_loop, stream, outbox_receive, hooks, writer_done)
        compute.start()
        try:
            await _read_loop(stream, compute, hooks)
        except WireError as exc:
            log.error("protocol error from parent: %s; exiting", exc)
            exit_code = EXIT_PROTOCOL_ERROR
        finally:
            compute.request_stop()
            with trio.CancelScope(shield=True):
                joined = await trio.to_thread.run_sync(compute.join, compute_join_timeout)
                if not joined:
                    # An exiting process with a live MLX thread aborts (exit -6): leave now.
                    log.error(
                        "compute thread still busy after %.1f s; exiting hard", compute_join_timeout
                    )
                    os._exit(EXIT_COMPUTE_STUCK)
                outbox_send.close()
                with trio.move_on_after(FLUSH_TIMEOUT_S):
                    await writer_done.wait()
            nursery.cancel_scope.cancel()
    return exit_code


async def _read_loop(stream: FramedStream, compute: ComputeThread, hooks: TestHooks) -> None:
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
                compute.submit_generate(request)
            case Cancel(request_id=request_id):
                compute.cancel(request_id)
            case Shutdown():
                if hooks.ignore_shutdown:
                    log.warning("test hook: ignoring Shutdown")
                    continue
                log.info("shutdown requested by parent")
                return


async def _write_loop(
    stream: FramedStream,
    outbox: trio.MemoryReceiveChannel[FromRunner],
    hooks: TestHooks,
    done: trio.Event,
) -> None:
    try:
        async with outbox:
            async for msg in outbox:
                await stream.send_message(msg, FromRunner)
                if hooks.garbage_after_ready and msg == StatusReport(RunnerReady()):
                    log.warning("test hook: sending a garbage frame")
                    await stream.send_frame(GARBAGE_FRAME)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        log.info("parent stopped reading; dropping remaining results")
    finally:
        done.set()
