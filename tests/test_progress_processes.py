"""Waits bounded by silence against real processes that work, sleep or have exited."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import trio

from trexo.progress import Silent, process_effort, wait_while_progressing


@pytest.fixture
def process() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; exec(sys.stdin.readline())"], stdin=subprocess.PIPE
    )
    try:
        yield child
    finally:
        child.kill()
        child.wait(timeout=10)


def run(child: subprocess.Popen[bytes], code: str) -> None:
    assert child.stdin is not None
    child.stdin.write(code.encode() + b"\n")
    child.stdin.flush()


async def test_a_silent_process_ends_the_wait(process: subprocess.Popen[bytes]) -> None:
    run(process, "import time; time.sleep(600)")
    with trio.fail_after(30):  # a hang guard: the wait must end by itself
        with pytest.raises(Silent):
            await wait_while_progressing(
                trio.sleep_forever, lambda: process_effort(process.pid), silence=0.6, poll=0.1
            )


async def test_a_working_process_keeps_the_wait_going(process: subprocess.Popen[bytes]) -> None:
    run(process, "while True: pass")
    done = trio.Event()

    async def finish_later() -> None:
        await trio.sleep(3.5)  # more than three silences: only its progress kept the wait on
        done.set()

    async def wait_done() -> str:
        await done.wait()
        return "finished"

    async with trio.open_nursery() as nursery:
        nursery.start_soon(finish_later)
        # A spinning process gets a twentieth of a core at load 20: 0.05 s of CPU a second.
        result = await wait_while_progressing(
            wait_done,
            lambda: process_effort(process.pid),
            silence=1.0,
            poll=0.1,
            min_cpu_s=0.02,
        )
    assert result == "finished"


def test_an_exited_process_cannot_be_read() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    assert process_effort(child.pid) is None
    assert process_effort(os.getpid()) is not None
