"""Real `trexo run` processes for end-to-end tests, always cleaned up."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import attrs
import psutil
import trio

START_TIMEOUT_S = 120.0
"""Generous: building the demo model and loading it takes about a second here."""
STOP_TIMEOUT_S = 15.0
URL = re.compile(r"https?://[^\s/]+")


@attrs.define
class TrexoProcess:
    process: trio.Process
    data_dir: Path
    url: str = ""
    stdout_lines: list[str] = attrs.field(factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    def runner_pids(self) -> list[int]:
        try:
            return [p.pid for p in psutil.Process(self.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def log_text(self) -> str:
        return (self.data_dir / "node.log").read_text(errors="replace")

    def runner_logs(self) -> str:
        logs = sorted((self.data_dir / "logs" / "runners").glob("*.log"))
        return "".join(p.read_text(errors="replace") for p in logs)


@asynccontextmanager
async def run_trexo(
    data_dir: Path, *args: str, env: dict[str, str] | None = None
) -> AsyncIterator[TrexoProcess]:
    """Start `trexo run --api-port 0 ARGS`, wait for its ready line, stop it afterwards."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log_file = (data_dir / "node.log").open("ab")
    command = [
        sys.executable,
        "-m",
        "trexo",
        "run",
        "--api-port",
        "0",
        "--data-dir",
        str(data_dir),
        *args,
    ]
    process = await trio.lowlevel.open_process(
        command,
        stdout=subprocess.PIPE,
        stderr=log_file,
        env={**os.environ, **(env or {})},
    )
    node = TrexoProcess(process, data_dir)
    try:
        async with trio.open_nursery() as nursery:
            ready = trio.Event()
            nursery.start_soon(_read_stdout, node, ready)
            with trio.fail_after(START_TIMEOUT_S):
                await ready.wait()
            yield node
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await stop(node)
            log_file.close()


async def _read_stdout(node: TrexoProcess, ready: trio.Event) -> None:
    assert node.process.stdout is not None
    buffer = b""
    async for data in node.process.stdout:
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            text = line.decode(errors="replace")
            node.stdout_lines.append(text)
            if text.startswith("trexo is ready") and (match := URL.search(text)):
                node.url = match.group(0)
                ready.set()


async def stop(node: TrexoProcess, sig: int = signal.SIGTERM) -> None:
    """Signal the node, wait (bounded), then kill it and anything it left behind."""
    leftovers = node.runner_pids()
    if node.process.returncode is None:
        node.process.send_signal(sig)
        with trio.move_on_after(STOP_TIMEOUT_S):
            await node.process.wait()
    if node.process.returncode is None:
        node.process.kill()
        await node.process.wait()
    for pid in leftovers:
        with suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
