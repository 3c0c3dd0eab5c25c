"""A node restarted with the same data dir while the others run rejoins as the same node
without an election storm: while a follower is away and back, no other node decides any
session; the master's restart costs the others the one election its loss started, and its
return none.

(A restarted node that meets nobody within its boot grace, 0.3 s, elects itself alone and
yields that solo session to the cluster once its links come up; the others never campaign
for it. Its solo clock is learned by all, so the next election's clock may skip one.)
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.cluster import Cluster, ClusterNode
from tests.waiting import holds_for

from .scenario import lab_cluster, master_and_followers

SETTLE_S = 2.0
"""How long the cluster is watched after a rejoin for a session change that must not come.
By then every link is up and every node reports one session; what could still start a
campaign is a link that fails after all (noticed within the frozen-peer bound, 1.2 s with
the default heartbeats) or a message still in flight, and a campaign decides within its
window (0.5 s): a late campaign shows in the trace within this."""


def decisions(trace_file: Path, nodes: list[ClusterNode]) -> list[tuple[str, int, str]]:
    """(node, clock, master) of every session `nodes` decided (or adopted), in order."""
    ids = {n.node_id for n in nodes}
    # Whole lines only: the nodes append to the trace while it is watched.
    lines = trace_file.read_text().split("\n")[:-1]
    events = [json.loads(line) for line in lines if line]
    return [
        (e["node"], e["clock"], e["master"])
        for e in events
        if e["event"] == "session_decided" and e["node"] in ids
    ]


async def restart(cluster: Cluster, node: ClusterNode, trace_file: Path) -> None:
    """Stop `node`, let the others see it gone, start it again and let it rejoin; then
    watch the others decide no session for `SETTLE_S`."""
    node_id = node.node_id
    await cluster.stop(node)
    await cluster.wait_converged(expect_nodes=len(cluster.nodes) - 1)
    await cluster.start(node)
    assert node.node_id == node_id  # the same node, by its data dir
    await cluster.wait_converged(expect_nodes=len(cluster.nodes))
    others = [n for n in cluster.nodes if n is not node]
    settled = decisions(trace_file, others)
    await holds_for(
        lambda: decisions(trace_file, others) == settled,
        seconds=SETTLE_S,
        what="no session decided by the others after the rejoin",
    )


async def test_a_restarted_node_rejoins_without_an_election_storm(tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.jsonl"
    async with lab_cluster(tmp_path, 3, env={"TREXO_TRACE_FILE": str(trace_file)}) as (
        cluster,
        _,
    ):
        first, master, (follower, other) = await master_and_followers(cluster)
        before = len(decisions(trace_file, [master, other]))
        await restart(cluster, follower, trace_file)
        assert decisions(trace_file, [master, other])[before:] == []
        assert await cluster.wait_converged() == first

        before = len(decisions(trace_file, [follower, other]))
        await restart(cluster, master, trace_file)
        second = await cluster.wait_converged()
        assert second["master_id"] != first["master_id"]
        # One decision each, for the master's loss: the same session on both; none after.
        assert sorted(decisions(trace_file, [follower, other])[before:]) == sorted(
            (node.node_id, second["clock"], second["master_id"]) for node in (follower, other)
        )
