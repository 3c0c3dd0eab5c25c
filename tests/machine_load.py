"""Load the machine on purpose, so that a real-process test runs as on a busy one.

`busy_machine(per_core=4)` starts `per_core` times the cores' count of processes that spin
on the CPU, at a chosen niceness (0: they compete with the test as equals), and stops and reaps
them when the block ends, whatever happened in it. `pause_pulses(pid, ...)` SIGSTOPs a
process for a while, again and again (a long GC pause, a starved event loop), and always
leaves it running.

    with busy_machine(per_core=4):
        ...  # the cluster, the requests, the checks
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import trio

SPIN = "while True: pass"
STOP_BOUND_S = 5.0
"""How long a spinning process may take to exit after SIGKILL (it is reaped)."""


@contextlib.contextmanager
def busy_machine(per_core: int = 4, niceness: int = 0) -> Iterator[list[int]]:
    """`per_core` spinning processes per core while the block runs; their pids."""
    count = per_core * (os.cpu_count() or 1)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-c", SPIN],
                    preexec_fn=(lambda: os.nice(niceness)) if niceness else None,
                )
            )
        yield [p.pid for p in processes]
    finally:
        for process in processes:
            process.kill()
        for process in processes:
            process.wait(timeout=STOP_BOUND_S)


async def pause_pulses(pid: int, pause: float, every: float) -> None:
    """SIGSTOP `pid` for `pause` seconds every `every` seconds until cancelled; it is always
    left running (SIGCONT), even when cancelled mid-pause."""
    try:
        while True:
            await trio.sleep(every - pause)
            os.kill(pid, signal.SIGSTOP)
            try:
                await trio.sleep(pause)
            finally:
                os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        return  # it exited
