"""A real cluster of `trexo run` processes on loopback shared by a test module: started once
(synchronously, outside any test's trio run), stopped and reaped after, whatever happened.

Tests that start runners in it (placing a model) must stop them again (delete the instance
and `wait_no_runners`): the autouse leak check fails a test that leaves a process behind.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import psutil

from tests.e2e.harness import RUNNER_MODULE
from tests.e2e.shared_node import launch, stop_processes, wait_ready_url
from tests.waiting import NotYet, wait_until_sync
from trexo.peer_port_file import read_peer_port

WAIT_TIMEOUT_S = 60.0
"""Generous: the machines that run tests are shared and slow by turns."""


@attrs.define
class ClusterNode:
    name: str
    data_dir: Path
    process: subprocess.Popen[bytes]
    url: str

    @property
    def node_id(self) -> str:
        return (self.data_dir / "node_id").read_text().strip()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def get(self, path: str) -> Any:
        """`GET path` on this node's API, decoded."""
        response = httpx.get(f"{self.url}{path}", timeout=10.0)
        response.raise_for_status()
        return response.json()

    def runner_pids(self) -> set[int]:
        pids = set()
        for child in psutil.Process(self.process.pid).children(recursive=True):
            try:
                if RUNNER_MODULE in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                    pids.add(child.pid)
            except psutil.NoSuchProcess:
                continue
        return pids

    def kill(self) -> None:
        """SIGKILL, as a crash or a pulled plug would end it; reaped at once."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()


@contextmanager
def shared_cluster(
    root: Path, size: int, *args: str, env: dict[str, str] | None = None
) -> Iterator[list[ClusterNode]]:
    """`size` nodes (`trexo run ARGS`) started at once, each linked to the first (they
    find the rest through it); yielded once every node sees them all in one session, under
    whichever master they elected."""
    nodes: list[ClusterNode] = []
    try:
        # Every node binds a peer port of the kernel's choosing (no other test can take it
        # between a choice and the bind); the others are started once the seed's is known.
        first = launch(root / "n0", *args, env=env)
        nodes.append(ClusterNode("n0", root / "n0", first, ""))
        nodes[0].url = wait_ready_url(first, nodes[0].data_dir)
        seed_port = read_peer_port(nodes[0].data_dir)
        for i in range(1, size):
            data_dir = root / f"n{i}"
            process = launch(data_dir, "--peer", f"127.0.0.1:{seed_port}", *args, env=env)
            nodes.append(ClusterNode(f"n{i}", data_dir, process, ""))
        for node in nodes[1:]:
            node.url = wait_ready_url(node.process, node.data_dir)
        wait_until_sync(
            lambda: _converged(nodes), timeout=WAIT_TIMEOUT_S, what="every node in one session"
        )
        yield nodes
    finally:
        stop_processes([node.process for node in nodes])


def _converged(nodes: list[ClusterNode]) -> bool | NotYet:
    healths = [node.get("/health") for node in nodes]
    sessions = {repr(h["session"]) for h in healths}
    return (
        len(sessions) == 1 and all(h["session"] and h["nodes"] == len(nodes) for h in healths)
    ) or NotYet([(h["session"], h["nodes"]) for h in healths])
