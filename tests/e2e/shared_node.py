"""One real `trexo run` shared by a test module, for dialect tests that each send a request
or two: started once (synchronously, outside any test's trio run), stopped and reaped after
the module, whatever happened."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import attrs
import httpx
import psutil

from .harness import ISOLATED, START_TIMEOUT_S, STOP_TIMEOUT_S, URL

POLL_S = 0.05


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
    data_dir.mkdir(parents=True, exist_ok=True)
    stdout_path = data_dir / "stdout.log"
    command = [sys.executable, "-m", "trexo", "run", "--data-dir", str(data_dir), *ISOLATED, *args]
    with (data_dir / "node.log").open("ab") as log, stdout_path.open("wb") as stdout:
        process = subprocess.Popen(command, stdout=stdout, stderr=log, env=dict(os.environ))
    try:
        node = SharedNode(_wait_ready(process, stdout_path, model), data_dir, model)
        yield node
    finally:
        _stop(process)


def _wait_ready(process: subprocess.Popen[bytes], stdout_path: Path, model: str) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    url = ""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"trexo exited with {process.returncode}")
        if not url:
            for line in stdout_path.read_text(errors="replace").splitlines():
                if line.startswith("trexo is ready") and (match := URL.search(line)):
                    url = match.group(0)
        if url and _model_ready(url, model):
            return url
        time.sleep(POLL_S)
    raise TimeoutError(f"{model} was not ready within {START_TIMEOUT_S} s")


def _model_ready(url: str, model: str) -> bool:
    try:
        listing = httpx.get(f"{url}/v1/models", timeout=5.0).json()
    except (httpx.HTTPError, ValueError):
        return False
    return any(entry["id"] == model and entry.get("ready") for entry in listing["data"])


def _stop(process: subprocess.Popen[bytes]) -> None:
    leftovers = []
    with suppress(psutil.NoSuchProcess):
        leftovers = psutil.Process(process.pid).children(recursive=True)
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(STOP_TIMEOUT_S)
    if process.poll() is None:
        process.kill()
        process.wait()
    for child in leftovers:
        with suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(leftovers, timeout=STOP_TIMEOUT_S)
