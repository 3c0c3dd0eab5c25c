"""One real `trexo run` shared by a test module, for dialect tests that each send a request
or two: started once (synchronously, outside any test's trio run), stopped and reaped after
the module, whatever happened. Its pieces (`launch`, `wait_ready_url`, `stop_process`) start
a module's shared cluster too (`tests.dashboard.cluster`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import attrs
import httpx
import psutil

from tests.waiting import NotYet, wait_until_sync

from .harness import ISOLATED, START_TIMEOUT_S, STOP_TIMEOUT_S, URL


@attrs.frozen
class SharedNode:
    url: str
    data_dir: Path
    model: str

    def log_text(self) -> str:
        return (self.data_dir / "node.log").read_text(errors="replace")


@contextmanager
def shared_node(data_dir: Path, model: str, *args: str) -> Iterator[SharedNode]:
    """`trexo run ARGS` serving `model`, once `model` answers as ready in `/v1/models`."""
    process = launch(data_dir, *args)
    try:
        url = wait_ready_url(process, data_dir, lambda url: _model_ready(url, model))
        yield SharedNode(url, data_dir, model)
    finally:
        stop_process(process)


def launch(
    data_dir: Path, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `trexo run ARGS` (isolated on loopback; later arguments override), its output
    in files under `data_dir`. Stop it with `stop_process`."""
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "trexo", "run", "--data-dir", str(data_dir), *ISOLATED, *args]
    environment = {**os.environ, **(env or {})}
    with (data_dir / "node.log").open("ab") as log, (data_dir / "stdout.log").open("wb") as stdout:
        return subprocess.Popen(command, stdout=stdout, stderr=log, env=environment)


def wait_ready_url(
    process: subprocess.Popen[bytes], data_dir: Path, ready: Callable[[str], bool] = bool
) -> str:
    """The API URL of the node `launch` started, once it printed it and `ready(url)` holds."""

    def ready_url() -> str | NotYet:
        if process.poll() is not None:
            raise RuntimeError(f"trexo exited with {process.returncode}")
        for line in (data_dir / "stdout.log").read_text(errors="replace").splitlines():
            if line.startswith("trexo is ready") and (match := URL.search(line)):
                url = match.group(0)
                return url if ready(url) else NotYet(f"{url} printed, not ready")
        return NotYet("no ready line")

    return wait_until_sync(ready_url, timeout=START_TIMEOUT_S, what=f"trexo in {data_dir} ready")


def _model_ready(url: str, model: str) -> bool:
    try:
        listing = httpx.get(f"{url}/v1/models", timeout=5.0).json()
    except (httpx.HTTPError, ValueError):
        return False
    return any(entry["id"] == model and entry.get("ready") for entry in listing["data"])


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Stop a node `launch` started (SIGTERM, bounded, then SIGKILL) and reap what it left."""
    stop_processes([process])


def stop_processes(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    """`stop_process` for several nodes at once: each is signalled before any is waited for,
    so a cluster stops in the time its slowest node takes, not in the sum of them all."""
    leftovers: list[psutil.Process] = []
    for process in processes:
        with suppress(psutil.NoSuchProcess):
            leftovers += psutil.Process(process.pid).children(recursive=True)
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in processes:
        with suppress(subprocess.TimeoutExpired):
            process.wait(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()
    for child in leftovers:
        with suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(leftovers, timeout=STOP_TIMEOUT_S)
