"""The machine-load helper: its spinning processes run while the block does and are reaped
after it, even when it fails; a paused process is always left running."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest
import trio

from tests.machine_load import busy_machine, pause_pulses


def test_spinning_processes_run_in_the_block_and_are_reaped_after_it() -> None:
    with pytest.raises(RuntimeError), busy_machine(per_core=1) as pids:
        assert len(pids) == psutil.cpu_count() and all(psutil.pid_exists(p) for p in pids)
        raise RuntimeError("the test failed")
    assert not any(psutil.pid_exists(p) for p in pids)


async def test_a_pulsed_process_is_left_running_when_the_pulses_stop() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # noqa: ASYNC220
    try:
        with trio.move_on_after(0.5):
            await pause_pulses(process.pid, 0.3, 0.4)  # cancelled mid-pause
        assert psutil.Process(process.pid).status() != psutil.STATUS_STOPPED
    finally:
        process.kill()
        process.wait()
