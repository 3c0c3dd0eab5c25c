"""A stand-in node for the orphan test: start a runner, load a model, print its pid, wait.

The test SIGKILLs this process and watches the runner go on its own (EOF on its socket).
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from trexo.worker.runner_supervisor import RunnerSupervisor


async def main(model_dir: Path) -> None:
    async with trio.open_nursery() as nursery:
        supervisor: RunnerSupervisor = await nursery.start(RunnerSupervisor("orphan").run)
        await supervisor.load(model_dir)
        print(f"READY {supervisor.pid}", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, Path(sys.argv[1]))
