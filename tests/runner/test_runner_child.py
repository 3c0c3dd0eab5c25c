"""The runner child on its own: spoken to directly over a socketpair, no supervisor."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from tests.waiting import wait_until_sync
from trexo import wire
from trexo.runner.exit_codes import EXIT_OK, EXIT_PROTOCOL_ERROR
from trexo.types.ipc import FromRunner, LoadModel, StatusReport, ToRunner
from trexo.types.runner_status import RunnerReady

from .helpers import TEST_TIMEOUT_S

ORPHAN_BOUND_S = 5.0
"""Generous: the benchmark measures the real figure (milliseconds)."""


@contextmanager
def runner_child(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], socket.socket]]:
    parent_end, child_end = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trexo.runner", "--ipc-fd", str(child_end.fileno())],
        pass_fds=(child_end.fileno(),),
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "runner.err").open("wb"),
    )
    child_end.close()
    try:
        yield proc, parent_end
    finally:
        parent_end.close()
        proc.kill()
        proc.wait(TEST_TIMEOUT_S)


def read_message(sock: socket.socket) -> FromRunner:
    header = sock.recv(4, socket.MSG_WAITALL)
    body = sock.recv(int.from_bytes(header, "big"), socket.MSG_WAITALL)
    msg: FromRunner = wire.from_json(body, FromRunner)
    return msg


def test_runner_exits_cleanly_on_eof(tmp_path: Path) -> None:
    with runner_child(tmp_path) as (proc, sock):
        sock.close()
        assert proc.wait(TEST_TIMEOUT_S) == EXIT_OK
    assert "parent closed the IPC socket" in (tmp_path / "runner.err").read_text()


def ignores(pid: int, signum: int) -> bool:
    """Whether the kernel discards `signum` for `pid` (its SigIgn mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(
        next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16
    )
    return bool(mask & (1 << (signum - 1)))


def test_runner_ignores_sigint(tmp_path: Path) -> None:
    with runner_child(tmp_path) as (proc, sock):
        wait_until_sync(
            lambda: ignores(proc.pid, signal.SIGINT),
            timeout=TEST_TIMEOUT_S,
            what="the runner ignoring SIGINT",
        )
        proc.send_signal(signal.SIGINT)
        # A signal not ignored acts before the process next runs, so before it reads the
        # EOF: a clean exit on EOF is proof that SIGINT did nothing.
        sock.close()
        assert proc.wait(TEST_TIMEOUT_S) == EXIT_OK


def test_garbage_from_the_parent_ends_the_runner_with_a_log_line(tmp_path: Path) -> None:
    with runner_child(tmp_path) as (proc, sock):
        sock.sendall(wire.encode_frame(b'{"type": "Launch"}'))
        assert proc.wait(TEST_TIMEOUT_S) == EXIT_PROTOCOL_ERROR
    err = (tmp_path / "runner.err").read_text()
    assert "protocol error from parent: invalid ToRunner: 'type' is 'Launch'" in err


def test_oversize_frame_from_the_parent_ends_the_runner(tmp_path: Path) -> None:
    with runner_child(tmp_path) as (proc, sock):
        sock.sendall((2**31).to_bytes(4, "big"))
        assert proc.wait(TEST_TIMEOUT_S) == EXIT_PROTOCOL_ERROR
    assert "frame header announces 2147483648 bytes" in (tmp_path / "runner.err").read_text()


def test_a_runner_whose_parent_is_killed_exits_on_its_own(tmp_path: Path, tiny_model: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("orphan_parent.py")), str(tiny_model)],
        stdout=subprocess.PIPE,
    )
    runner_pid = None
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline().decode()
        assert line.startswith("READY "), line
        runner_pid = int(line.split()[1])
        runner = psutil.Process(runner_pid)
        parent.kill()
        parent.wait(TEST_TIMEOUT_S)
        gone, _ = psutil.wait_procs([runner], timeout=ORPHAN_BOUND_S)
        assert gone, f"runner {runner_pid} outlived its parent by {ORPHAN_BOUND_S} s"
    finally:
        parent.kill()
        parent.wait(TEST_TIMEOUT_S)
        if runner_pid is not None and psutil.pid_exists(runner_pid):
            os.kill(runner_pid, signal.SIGKILL)


def test_runner_reports_loading_then_ready(tmp_path: Path, tiny_model: Path) -> None:
    with runner_child(tmp_path) as (proc, sock):
        sock.sendall(wire.encode_frame(wire.to_json(LoadModel(str(tiny_model)), ToRunner)))
        sock.settimeout(TEST_TIMEOUT_S)
        seen = []
        while (msg := read_message(sock)) != StatusReport(RunnerReady()):
            seen.append(msg)
        assert seen, "expected loading progress before ready"
        assert all(type(m.status).__name__ == "RunnerLoading" for m in seen)  # type: ignore[union-attr]
        sock.close()
        assert proc.wait(TEST_TIMEOUT_S) == EXIT_OK
