"""Checks a client's JSON schema in a process of its own, bounded in time and memory.

A `response_format` schema under 1 KB can ask llguidance for minutes and gigabytes (an
`allOf` of regex patterns: each multiplies the lexer's states). llguidance's own limits do
not bound that step, and a thread cannot be stopped (the compile runs in Rust and releases
the GIL, so a thread would spare the event loop but still run for minutes and take the
memory). So each new schema is compiled by a fresh interpreter (`trexo.engine.schema_child`)
whose address space (`RLIMIT_AS`) and CPU time (`RLIMIT_CPU`) are capped: the kernel ends
it past either, the request gets a 400 saying why, and the node's memory and event loop are
untouched. CPU time, not the clock, so a busy machine never fails a good schema.

Why a process per schema, not a pool of warm ones: a killed or aborted compiler is simply
gone, nothing has to be replaced or health-checked, and every compile starts from a clean
heap. It costs an interpreter start (~0.1 s quiet; the compile's CPU is counted only once the
child says it is ready, so a busy machine's slow start is not held against the schema) and
only for a schema not seen lately: verdicts are remembered by the schema's digest, and a
client sends the same schema with every request. At most a few compile at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import subprocess
import sys
from collections import OrderedDict
from typing import Final

import trio

from trexo.config import (
    SCHEMA_COMPILE_CPU_S,
    SCHEMA_COMPILE_MEMORY_BYTES,
    SCHEMA_COMPILE_PROCESSES,
    SCHEMA_COMPILE_QUEUE_TIMEOUT_S,
    SCHEMA_COMPILE_START_TIMEOUT_S,
    SCHEMA_COMPILE_WALL_LIMIT_S,
    SCHEMA_VERDICT_CACHE_SIZE,
)
from trexo.errors import Unavailable

log = logging.getLogger(__name__)

CHILD_MODULE: Final = "trexo.engine.schema_child"
READY: Final = b"ready\n"
VERDICT_MAX_BYTES: Final = 64 * 1024
"""A verdict is one short JSON line; more is a broken child."""
MESSAGE_MAX_CHARS: Final = 500
"""llguidance's errors can quote the whole grammar: a client gets the start."""
REAP_TIMEOUT_S: Final = 5.0
"""A killed compiler is reaped in milliseconds; this only bounds the wait."""


class SchemaRefused(ValueError):
    """The schema cannot be used (the message says why, for the client: HTTP 400)."""


class SchemaGuard:
    """Checks schemas within `cpu_seconds` of CPU and `memory_bytes` each, `processes` at
    once; `wall_limit` is a backstop by the clock for a compiler that gets no CPU.

    `check` raises `SchemaRefused` for a schema that does not compile in time and memory,
    or not at all; `Unavailable` (retry) when no compiler could be had in time.
    """

    def __init__(
        self,
        *,
        cpu_seconds: int = SCHEMA_COMPILE_CPU_S,
        wall_limit: float = SCHEMA_COMPILE_WALL_LIMIT_S,
        memory_bytes: int = SCHEMA_COMPILE_MEMORY_BYTES,
        start_timeout: float = SCHEMA_COMPILE_START_TIMEOUT_S,
        queue_timeout: float = SCHEMA_COMPILE_QUEUE_TIMEOUT_S,
        processes: int = SCHEMA_COMPILE_PROCESSES,
        cache_size: int = SCHEMA_VERDICT_CACHE_SIZE,
    ) -> None:
        if cpu_seconds < 1:
            raise ValueError(f"cpu_seconds is whole seconds, at least 1, not {cpu_seconds}")
        self.cpu_seconds = cpu_seconds
        self.wall_limit = wall_limit
        self.memory_bytes = memory_bytes
        self._start_timeout = start_timeout
        self._queue_timeout = queue_timeout
        self._processes = processes
        self._limiter: trio.CapacityLimiter | None = None  # made in the trio run that uses it
        self._cache_size = cache_size
        self._verdicts: OrderedDict[bytes, str | None] = OrderedDict()
        """Schema digest -> why it was refused (None: accepted); recent last."""

    async def check(self, schema_json: str) -> None:
        key = hashlib.sha256(schema_json.encode("utf-8", errors="replace")).digest()
        if key in self._verdicts:
            self._verdicts.move_to_end(key)
            refusal = self._verdicts[key]
        else:
            refusal = await self._compile(schema_json)
            self._verdicts[key] = refusal
            while len(self._verdicts) > self._cache_size:
                self._verdicts.popitem(last=False)
        if refusal is not None:
            raise SchemaRefused(refusal)

    async def _compile(self, schema_json: str) -> str | None:
        """Why the schema cannot be used (None: it can), from a compiler process."""
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(self._processes)
        with trio.move_on_after(self._queue_timeout) as waiting:
            await self._limiter.acquire()
        if waiting.cancelled_caught:
            raise Unavailable("too many JSON schemas are being checked on this node now; retry")
        try:
            outcome = await self._run_child(schema_json)
        finally:
            self._limiter.release()
        if isinstance(outcome, Unavailable):
            raise outcome
        return outcome

    async def _run_child(self, schema_json: str) -> str | Unavailable | None:
        argv = [
            sys.executable,
            "-m",
            CHILD_MODULE,
            str(self.memory_bytes),
            str(self.cpu_seconds),
        ]
        try:
            process = await trio.lowlevel.open_process(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
        except OSError as exc:  # out of file descriptors, or of processes
            log.warning("could not start a JSON schema compiler: %s", exc)
            return Unavailable("this node cannot check JSON schemas right now; retry")
        try:
            return await self._talk(process, schema_json)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(REAP_TIMEOUT_S):
                if process.returncode is None:
                    process.kill()  # still compiling: SIGKILL, a compile in Rust heeds no less
                for pipe in (process.stdin, process.stdout):
                    if pipe is not None:
                        await pipe.aclose()
                await process.wait()

    async def _talk(self, process: trio.Process, schema_json: str) -> str | Unavailable | None:
        assert process.stdin is not None and process.stdout is not None
        ready = b""
        with trio.move_on_after(self._start_timeout):  # bounds a slow start, not the compile
            ready = await _read_until(process.stdout, len(READY))
        if ready != READY:
            log.warning(
                "the JSON schema compiler did not start within %g s: %r",
                self._start_timeout,
                ready[:200],
            )
            return Unavailable("this node cannot check JSON schemas right now; retry")
        with trio.move_on_after(self.wall_limit):
            try:
                await process.stdin.send_all(schema_json.encode("utf-8", errors="replace"))
                await process.stdin.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # it died reading: its exit says why
            verdict = await _read_until(process.stdout, VERDICT_MAX_BYTES)
            returncode = await process.wait()
            return self._judge(verdict, returncode)
        log.warning("a JSON schema compiler got no answer out within %g s", self.wall_limit)
        return Unavailable("this node is too busy to check JSON schemas right now; retry")

    def _judge(self, verdict: bytes, returncode: int) -> str | None:
        if returncode == -signal.SIGXCPU:
            return (
                "the JSON schema is too complex: it did not compile within "
                f"{self.cpu_seconds} s of CPU time (regex patterns combined with allOf "
                "multiply the work)"
            )
        out_of_memory = (
            f"the JSON schema is too complex: compiling it needs more than "
            f"{self.memory_bytes // 2**20} MiB (regex patterns combined with allOf multiply it)"
        )
        try:
            found = json.loads(verdict) if returncode == 0 else None
        except ValueError:
            found = None
        if not isinstance(found, dict):
            # Aborted by the allocator at the memory limit (or crashed): not usable here.
            log.info("a JSON schema compiler ended with %s: %r", returncode, verdict[:200])
            return out_of_memory
        if found.get("memory"):
            return out_of_memory
        error = found.get("error")
        return None if error is None else str(error)[:MESSAGE_MAX_CHARS]


async def _read_until(stream: trio.abc.ReceiveStream, most: int) -> bytes:
    """What `stream` says up to and including its first newline, or EOF, or `most` bytes."""
    data = bytearray()
    while len(data) < most and b"\n" not in data:
        chunk = await stream.receive_some(most - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)
