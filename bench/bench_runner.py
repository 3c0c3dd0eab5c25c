"""Runner lifecycle benchmark: spawn-to-ready, graceful stop, and orphan exit.

- spawn-to-ready: `RunnerSupervisor` started until the tiny demo model is loaded and warm;
- graceful stop: cancelling a loaded runner's scope until `run` has returned (process reaped);
- orphan exit: SIGKILL of a parent process holding a loaded runner until the runner has
  exited, observed through a pidfd (exact, no polling interval).

Trials of the three kinds are interleaved.
Run: `nox -s bench-runner` (or `python bench/bench_runner.py -n 20`).
"""

from __future__ import annotations

import argparse
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import markdown_table, summarize, write_results
from trexo.engine.demo_model import ensure_demo_model
from trexo.worker.runner_supervisor import RunnerSupervisor

ORPHAN_PARENT = Path(__file__).resolve().parents[1] / "tests" / "runner" / "orphan_parent.py"
ORPHAN_TIMEOUT_S = 10.0


async def lifecycle_trial(model_dir: Path) -> tuple[float, float]:
    """One runner: (spawn-to-ready, graceful stop) in seconds."""
    with trio.CancelScope() as outer:
        async with trio.open_nursery() as nursery:
            t0 = time.perf_counter()
            supervisor: RunnerSupervisor = await nursery.start(RunnerSupervisor("bench").run)
            await supervisor.load(model_dir)
            ready = time.perf_counter() - t0
            t1 = time.perf_counter()
            nursery.cancel_scope.cancel()
        stop = time.perf_counter() - t1
    assert not outer.cancelled_caught
    assert supervisor.stop_step == "shutdown", supervisor.stop_step
    return ready, stop


def orphan_trial(model_dir: Path) -> float:
    """SIGKILL a parent holding a loaded runner; seconds until the runner has exited."""
    parent = subprocess.Popen(
        [sys.executable, str(ORPHAN_PARENT), str(model_dir)], stdout=subprocess.PIPE
    )
    try:
        assert parent.stdout is not None
        runner_pid = int(parent.stdout.readline().split()[1])
        pidfd = os.pidfd_open(runner_pid)
        try:
            t0 = time.perf_counter()
            parent.kill()
            readable, _, _ = select.select([pidfd], [], [], ORPHAN_TIMEOUT_S)
            elapsed = time.perf_counter() - t0
            if not readable:
                os.kill(runner_pid, 9)
                raise RuntimeError(f"runner outlived its parent by {ORPHAN_TIMEOUT_S} s")
            return elapsed
        finally:
            os.close(pidfd)
    finally:
        parent.kill()
        parent.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", "--trials", type=int, default=20)
    args = parser.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = ensure_demo_model(Path(tmp), "tiny")
        ready, stop, orphan = [], [], []
        for i in range(args.trials):
            r, s = trio.run(lifecycle_trial, model_dir)
            ready.append(r)
            stop.append(s)
            orphan.append(orphan_trial(model_dir))
            print(f"trial {i + 1}: ready {r:.3f} s, stop {s:.4f} s, orphan {orphan[-1]:.4f} s")
    rows = {
        "spawn to ready (tiny model)": summarize(ready),
        "graceful stop of a loaded runner": summarize(stop),
        "runner exit after parent SIGKILL": summarize(orphan),
    }
    path = write_results("runner", {"trials": args.trials, "results": rows})
    print(markdown_table(rows))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
