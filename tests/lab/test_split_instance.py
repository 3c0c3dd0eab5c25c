"""A pipeline instance across two hosts whose second host is cut off: its first rank ends
within a bound (nobody is left blocked in a collective), the model is placed again on the
hosts still linked and serves there; after the heal there is still one instance."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.e2e.cluster import Cluster, ClusterNode
from tests.waiting import NotYet, wait_until

from .scenario import (
    MODEL,
    SERVE_TIMEOUT_S,
    gone,
    instances_of,
    lab_cluster,
    master_and_followers,
    place,
    state,
    wait_serving,
)

TEARDOWN_BOUND_S = 15.0
"""Generous against hangs: a cut peer is noticed in ~1.2 s (heartbeats), a stalled rank
ends itself after 3 s."""


async def placements(cluster: Cluster, node: ClusterNode) -> list[set[str]]:
    return [set(holders) for holders in instances_of(await state(cluster, node), MODEL).values()]


async def test_a_pipeline_whose_host_is_cut_off_is_torn_down_and_placed_again(
    tmp_path: Path,
) -> None:
    async with lab_cluster(tmp_path, 3) as (cluster, the_lab):
        nodes = cluster.nodes
        _, master, (first, second) = await master_and_followers(cluster)
        await place(cluster, master, MODEL, [first, second], sharding="pipeline")
        await wait_serving(master, MODEL)
        assert first.process is not None and second.process is not None
        first_rank = first.process.runner_pids()
        assert len(first_rank) == 1 and len(second.process.runner_pids()) == 1

        assert second.host is not None
        the_lab.cut(second.host)
        cut_at = trio.current_time()
        await wait_until(
            lambda: gone(first_rank), timeout=TEARDOWN_BOUND_S, what="the first rank gone"
        )
        teardown_s = trio.current_time() - cut_at
        await cluster.wait_converged(among=[master, first])
        survivors = {master.node_id, first.node_id}

        async def placed_again() -> bool | NotYet:
            placed = await placements(cluster, master)
            return placed == [survivors] or NotYet(placed)

        converged_at = trio.current_time()
        await wait_until(
            placed_again, timeout=SERVE_TIMEOUT_S, what=f"{MODEL} placed on the survivors only"
        )
        replaced_s = trio.current_time() - converged_at
        await wait_serving(first, MODEL)
        print(f"first rank gone {teardown_s:.2f} s after the cut; placed again {replaced_s:.2f} s")

        the_lab.heal(second.host)
        await cluster.wait_converged(expect_nodes=3)
        for node in nodes:
            assert await placements(cluster, node) == [survivors]
        cut_node = second.process

        await wait_until(
            lambda: not cut_node.runner_pids() or NotYet(cut_node.runner_pids()),
            timeout=SERVE_TIMEOUT_S,
            what="no runner left on the healed node",
        )
        await wait_serving(second, MODEL)
