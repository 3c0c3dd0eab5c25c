"""A network split in two (2 hosts | 3 hosts): each side elects its own master and keeps
serving, reads and commands alike, and once the split ends the cluster has one master and
the state of the side whose master won the merge.

trexo has no quorum: a minority side is not read-only. Both sides accept placements and
deletions while apart; when they meet again, the merge election's winner (the highest
candidacy: clock, seniority, commands seen, node id; not the larger side) carries its own
side's state over, and what only the other side decided is undone (its instances are
stopped). Nothing is placed twice: a model the two sides each placed again is kept once.
"""

from __future__ import annotations

from pathlib import Path

import trio

from tests.e2e.cluster import Cluster, ClusterNode
from tests.waiting import NotYet, wait_until

from .scenario import (
    MODEL,
    OTHER_MODEL,
    SERVE_TIMEOUT_S,
    ids,
    instances_of,
    lab_cluster,
    place,
    state,
    wait_serving,
)

MERGE_BOUND_S = 6.0
"""Generous against hangs: detection is ~1.2 s of heartbeats, a merge under 1.5 s."""


async def layout(cluster: Cluster, node: ClusterNode) -> set[tuple[str, tuple[str, ...]]]:
    """(model, nodes) of every instance in `node`'s state."""
    snapshot = await state(cluster, node)
    return {
        (model, tuple(nodes))
        for model in (MODEL, OTHER_MODEL)
        for nodes in instances_of(snapshot, model).values()
    }


async def reads_answer(cluster: Cluster, node: ClusterNode) -> None:
    for path in ("/health", "/state", "/v1/models", "/instances"):
        response = await cluster.http.get(f"{node.url}{path}")
        assert response.status_code == 200, (path, response.text)


async def test_both_sides_of_a_partition_serve_and_the_merge_keeps_one_sides_state(
    tmp_path: Path,
) -> None:
    async with lab_cluster(tmp_path, 5) as (cluster, the_lab):
        nodes = cluster.nodes
        minority, majority = nodes[:2], nodes[2:]
        await place(cluster, nodes[4], MODEL, [minority[0]])
        await wait_serving(nodes[4], MODEL)

        the_lab.partition([n.host for n in minority if n.host is not None])
        small = await cluster.wait_converged(among=minority)
        large = await cluster.wait_converged(among=majority)
        assert small["master_id"] in ids(minority)
        assert large["master_id"] in ids(majority)
        for node in nodes:  # reads answer on both sides
            await reads_answer(cluster, node)
        # Commands too, on both sides: the majority placed the lost model again by
        # itself; each side places one more.
        await place(cluster, minority[1], OTHER_MODEL, [minority[1]])
        await place(cluster, majority[0], OTHER_MODEL, [majority[1]])
        for side in (minority, majority):
            for model in (MODEL, OTHER_MODEL):
                await wait_serving(side[-1], model)
        sides = {
            small["master_id"]: await layout(cluster, minority[0]),
            large["master_id"]: await layout(cluster, majority[0]),
        }
        assert sides[small["master_id"]] == {
            (MODEL, (minority[0].node_id,)),
            (OTHER_MODEL, (minority[1].node_id,)),
        }

        the_lab.end_partition()
        healed_at = trio.current_time()
        merged = await cluster.wait_converged(expect_nodes=5)
        merged_s = trio.current_time() - healed_at
        print(f"one master {merged_s:.2f} s after the partition ended")
        assert merged_s < MERGE_BOUND_S
        kept = sides.get(merged["master_id"])
        for node in nodes:
            got = await layout(cluster, node)
            assert kept is None or got == kept, (merged, sides, got)
            kept = got
        assert kept in sides.values()
        assert sorted(model for model, _ in kept) == [MODEL, OTHER_MODEL]  # one of each

        want = {n.node_id: 0 for n in nodes}
        for _, holders in kept:
            for holder in holders:
                want[holder] += 1

        def runners_match_the_state() -> bool | NotYet:
            have = {
                n.node_id: len(n.process.runner_pids()) if n.process is not None else None
                for n in nodes
            }
            return have == want or NotYet(have)

        await wait_until(
            runners_match_the_state, timeout=SERVE_TIMEOUT_S, what=f"runners as placed: {want}"
        )
        for model in (MODEL, OTHER_MODEL):
            for node in (minority[0], majority[2]):
                await wait_serving(node, model)
