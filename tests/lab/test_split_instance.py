"""A pipeline instance across two hosts whose second host is cut off: its first rank ends
within a bound (nobody is left blocked in a collective), the model is placed again on the
hosts still linked and serves there; after the heal there is still one instance."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.cluster import Cluster, ClusterNode

from .scenario import (
    MODEL,
    gone,
    instances_of,
    lab_cluster,
    master_and_followers,
    place,
    state,
    wait_serving,
    wait_until,
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

        async def first_rank_gone() -> bool:
            return gone(first_rank)

        teardown_s = await wait_until(first_rank_gone, TEARDOWN_BOUND_S)
        await cluster.wait_converged(among=[master, first])
        survivors = {master.node_id, first.node_id}

        async def placed_again() -> bool:
            return await placements(cluster, master) == [survivors]

        replaced_s = await wait_until(placed_again)
        await wait_serving(first, MODEL)
        print(f"first rank gone {teardown_s:.2f} s after the cut; placed again {replaced_s:.2f} s")

        the_lab.heal(second.host)
        await cluster.wait_converged(expect_nodes=3)
        for node in nodes:
            assert await placements(cluster, node) == [survivors]
        cut_node = second.process

        async def cut_node_holds_no_runner() -> bool:
            return not cut_node.runner_pids()

        await wait_until(cut_node_holds_no_runner)
        await wait_serving(second, MODEL)
