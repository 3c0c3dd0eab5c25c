"""Split instances on a busy machine (4 spinning processes per core): 2- and 3-rank pipeline
and tensor instances of the demo model come up and answer, slower but without one failed
bring-up (no "did not join", no failed load, no runner restarted); and a rank whose runner
is SIGKILLed while its group forms still ends the group at once.

`TREXO_BUSY_ROUNDS` sets how many times the four layouts come up in a row (default 1; the
issue's figure is from 10). Run alone (`nox -s tests-busy`).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import openai
import trio

from tests.e2e.cluster import Cluster, ClusterNode, open_cluster
from tests.e2e.test_sharded import alive, delete_all, state
from tests.machine_load import busy_machine
from tests.waiting import wait_answered, wait_until

MODEL = "trexo-demo-tiny"
ROUNDS = int(os.environ.get("TREXO_BUSY_ROUNDS", "1"))
LAYOUTS: tuple[dict[str, Any], ...] = (
    {"sharding": "pipeline", "nodes": 2},
    {"sharding": "tensor", "nodes": 2},
    {"sharding": "pipeline", "nodes": 3},
    {"sharding": "tensor", "nodes": 3},
)
CONVERGE_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 600.0
"""A hang guard only: at load 8 a rank's interpreter and MLX take tens of seconds to start."""
TEARDOWN_BOUND_S = 30.0
"""A hang guard for "at once": the group's other rank goes as soon as its supervisor hears
the death (milliseconds quiet; its stop ladder and a busy scheduler add seconds)."""
FAILED_BRING_UP = ("did not join", "could not load", "did not start", "no progress")


async def chat(node: ClusterNode) -> str:
    client = openai.AsyncOpenAI(
        base_url=f"{node.url}/v1", api_key="x", max_retries=0, timeout=READY_TIMEOUT_S
    )
    reply = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is a generator?"}],
        max_tokens=8,
        temperature=0.0,
    )
    return reply.choices[0].message.content or ""


async def place(cluster: Cluster, via: ClusterNode, layout: dict[str, Any]) -> None:
    response = await cluster.http.post(f"{via.url}/instances", json={"model": MODEL, **layout})
    assert response.status_code == 201, response.text


def failed_bring_ups(cluster: Cluster) -> list[str]:
    lines = []
    for node in cluster.nodes:
        log = (node.data_dir / "node.log").read_text(errors="replace")
        lines += [
            f"{node.name}: {line}"
            for line in log.splitlines()
            if any(words in line for words in FAILED_BRING_UP)
        ]
    return lines


async def test_split_instances_come_up_on_a_busy_machine(tmp_path: Path) -> None:
    with busy_machine(per_core=4):
        async with open_cluster(tmp_path) as cluster:
            nodes = await cluster.add_many(3, "--no-model")
            await cluster.wait_converged(3, timeout=CONVERGE_TIMEOUT_S)
            times = []
            for round_ in range(ROUNDS):
                for layout in LAYOUTS:
                    started = time.monotonic()
                    await place(cluster, nodes[0], layout)
                    await wait_answered(
                        lambda: chat(nodes[1]),
                        retry_on=openai.APIError,
                        timeout=READY_TIMEOUT_S,
                        what=f"a chat with the {layout} instance",
                    )
                    times.append(time.monotonic() - started)
                    (split,) = (await state(cluster, nodes[0]))["instances"].values()
                    assert len(split["assignments"]) == layout["nodes"]
                    await delete_all(cluster, nodes[0])
                    assert failed_bring_ups(cluster) == [], (round_, layout)
            shown = ", ".join(f"{t:.0f}" for t in times)
            print(f"{len(times)} split instances up and answering, seconds each: {shown}")


async def test_a_rank_killed_while_joining_its_group_ends_the_group_at_once(
    tmp_path: Path,
) -> None:
    with busy_machine(per_core=4):
        async with open_cluster(tmp_path) as cluster:
            first, second = await cluster.add_many(2, "--no-model")
            await cluster.wait_converged(2, timeout=CONVERGE_TIMEOUT_S)
            await place(cluster, first, {"sharding": "pipeline", "nodes": 2})
            assert first.process is not None and second.process is not None
            first_process, second_process = first.process, second.process

            def both_joining() -> tuple[int, int] | None:
                # Each rank's runner says when it starts connecting to its peers (its log
                # lines are in its node's log).
                logs = first_process.log_text(), second_process.log_text()
                if not all("joining group epoch" in log for log in logs):
                    return None
                pids = first_process.runner_pids(), second_process.runner_pids()
                return (pids[0][0], pids[1][0]) if all(pids) else None

            survivor, victim = await wait_until(
                both_joining, timeout=READY_TIMEOUT_S, what="both ranks joining their group"
            )
            os.kill(victim, signal.SIGKILL)
            killed_at = trio.current_time()
            await wait_until(
                lambda: not alive(survivor),
                timeout=TEARDOWN_BOUND_S,
                what="the other rank's runner gone",
            )
            print(f"the other rank ended {trio.current_time() - killed_at:.2f} s after the kill")
