"""Hosts in network namespaces of their own find each other by multicast beacons alone (no
`--peer`) and agree on one master; a master whose cable is pulled is replaced, and when it
is plugged back in there is one master again, with no instance lost or duplicated."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.e2e.cluster import LAB_API_PORT

from .scenario import (
    MODEL,
    instances_of,
    lab_cluster,
    master_and_followers,
    place,
    state,
    wait_serving,
    wait_until,
)

REPLACE_BOUND_S = 5.0
HEAL_BOUND_S = 4.0
"""Generous bounds against hangs (measured: ~1.1 s and 0.2-1.2 s)."""


async def test_three_hosts_find_each_other_by_multicast_and_agree_on_a_master(
    tmp_path: Path,
) -> None:
    async with lab_cluster(tmp_path, 3) as (cluster, the_lab):
        nodes = cluster.nodes
        session = await cluster.wait_converged()
        # Each node is on its own host's address, not loopback.
        assert {node.url for node in nodes} == {
            f"http://{host.address}:{LAB_API_PORT}" for host in the_lab.hosts
        }
        masters = [h for n in nodes if (h := await cluster.health(n)) and h["is_master"]]
        assert [m["node_id"] for m in masters] == [session["master_id"]]


async def test_a_cut_off_master_is_replaced_and_after_the_heal_there_is_one_master(
    tmp_path: Path,
) -> None:
    async with lab_cluster(tmp_path, 3) as (cluster, the_lab):
        nodes = cluster.nodes
        first, master, others = await master_and_followers(cluster)
        # A model on a follower: the cut must neither lose it nor, after the heal, double it.
        await place(cluster, master, MODEL, [others[0]])
        await wait_serving(others[1], MODEL)
        assert master.host is not None
        the_lab.cut(master.host)
        cut_at = trio.current_time()
        second = await cluster.wait_converged(among=others)
        replaced_s = trio.current_time() - cut_at
        assert second["master_id"] != first["master_id"]
        await wait_serving(others[1], MODEL)
        the_lab.heal(master.host)
        healed_at = trio.current_time()
        third = await cluster.wait_converged(expect_nodes=3)
        merged_s = trio.current_time() - healed_at
        print(f"replaced in {replaced_s:.2f} s, one master {merged_s:.2f} s after the heal")
        assert third["master_id"] in {n.node_id for n in nodes}
        assert replaced_s < REPLACE_BOUND_S
        assert merged_s < HEAL_BOUND_S
        # The cut-off master placed the model again on itself while alone; the merged
        # cluster keeps one instance, still on the follower, and it answers everywhere.
        for node in nodes:
            snapshot = await state(cluster, node)
            assert list(instances_of(snapshot, MODEL).values()) == [[others[0].node_id]]
        await wait_serving(master, MODEL)
        # ... and the runner the cut-off master started for itself is gone.
        assert master.process is not None and others[0].process is not None
        cut_master = master.process

        async def only_the_followers_runner() -> bool:
            return not cut_master.runner_pids()

        await wait_until(only_the_followers_runner)
        assert len(others[0].process.runner_pids()) == 1
