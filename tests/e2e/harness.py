"""Real `trexo run` processes for end-to-end tests, always cleaned up."""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import attrs
import psutil
import trio

from tests.waiting import NotYet, wait_until
from trexo.peer_port_file import read_peer_port

START_TIMEOUT_S = 120.0
"""Generous: building the demo model and loading it takes about a second here."""
STOP_TIMEOUT_S = 15.0
ISOLATED = ("--api-port", "0", "--peer-host", "127.0.0.1", "--peer-port", "0", "--no-multicast")
"""Tests stay on loopback and never beacon to the LAN; later arguments override these."""
URL = re.compile(r"https?://[^\s/]+")
RUNNER_MODULE = "trexo.runner"


@attrs.define
class TrexoProcess:
    process: trio.Process
    data_dir: Path
    url: str = ""

    @property
    def pid(self) -> int:
        return self.process.pid

    def runner_pids(self) -> list[int]:
        """The node's runner processes (not its download process, which waits for work)."""
        pids = []
        for child in self._children():
            try:  # a child may become a zombie between the listing and this look
                if RUNNER_MODULE in child.cmdline():
                    pids.append(child.pid)
            except psutil.NoSuchProcess:
                continue
        return pids

    def child_pids(self) -> list[int]:
        """Every process the node started: runners and its download process."""
        return [p.pid for p in self._children()]

    def _children(self) -> list[psutil.Process]:
        try:
            children = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        alive = []
        for child in children:
            try:
                child.cmdline()
            except psutil.NoSuchProcess:
                continue
            alive.append(child)
        return alive

    def log_text(self) -> str:
        return (self.data_dir / "node.log").read_text(errors="replace")

    def peer_port(self) -> int:
        """The peer port this start of the node bound (written before its ready line)."""
        port = read_peer_port(self.data_dir)
        assert port is not None, f"no peer port written by trexo in {self.data_dir}"
        return port

    def runner_logs(self) -> str:
        logs = sorted((self.data_dir / "logs" / "runners").glob("*.log"))
        return "".join(p.read_text(errors="replace") for p in logs)


@asynccontextmanager
async def run_trexo(
    data_dir: Path,
    *args: str,
    env: dict[str, str] | None = None,
    entry: Sequence[str] = ("-m", "trexo"),
    wrapper: Sequence[str] = (),
    isolation: Sequence[str] = ISOLATED,
) -> AsyncIterator[TrexoProcess]:
    """Start `trexo run ARGS` (isolated on loopback), wait for its ready line, stop it after.

    `entry` is what python runs: `-m trexo`, or a test's launcher script taking the same
    arguments. `wrapper` runs it (`ip netns exec NS`: it execs, so the pid stays trexo's);
    `isolation` replaces the loopback-only arguments (a lab host has its own network).

    Output goes to files, not pipes, so nothing has to keep reading while the test runs
    (and no nursery has to outlive this block: clusters start and stop nodes in any order).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    stdout_path = data_dir / "stdout.log"
    stdout_path.write_text("")
    command = [
        *wrapper,
        sys.executable,
        *entry,
        "run",
        "--data-dir",
        str(data_dir),
        *isolation,
        *args,
    ]
    with (data_dir / "node.log").open("ab") as log_file, stdout_path.open("ab") as stdout:
        process = await trio.lowlevel.open_process(
            command, stdout=stdout, stderr=log_file, env={**os.environ, **(env or {})}
        )
    node = TrexoProcess(process, data_dir)
    try:
        node.url = await wait_until(
            lambda: ready_url(node, stdout_path),
            timeout=START_TIMEOUT_S,
            what=f"the ready line of trexo in {data_dir}",
        )
        yield node
    finally:
        with trio.CancelScope(shield=True):
            await stop(node)


def ready_url(node: TrexoProcess, stdout_path: Path) -> str | NotYet:
    """The URL in the node's ready line (or the line saying its model cannot be served); an
    error if it exited before printing one."""
    if node.process.returncode is not None:
        raise RuntimeError(
            f"trexo exited with {node.process.returncode}: {node.log_text()[-2000:]}"
        )
    for line in stdout_path.read_text(errors="replace").splitlines():
        if line.startswith(("trexo is ready", "trexo is up")) and (match := URL.search(line)):
            return match.group(0)
    return NotYet(last_line(node.log_text()))


def last_line(text: str) -> str:
    """The last line of a log (what a process was doing when a wait for it ran out)."""
    lines = text.rstrip().splitlines()
    return lines[-1] if lines else ""


async def stop(node: TrexoProcess, sig: int = signal.SIGTERM) -> None:
    """Signal the node, wait (bounded), then kill it and anything it left behind."""
    leftovers = node.child_pids()
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
