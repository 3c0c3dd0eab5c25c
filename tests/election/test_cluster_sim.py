"""Several election cores in a simulated cluster (deterministic delivery order)."""

from __future__ import annotations

from trexo.election.outputs import CampaignReason, CampaignStarted, Decided
from trexo.types.election import Campaign
from trexo.types.ids import NodeId
from trexo.types.session import Session

from .sim import CONFIG, SimCluster


def campaigns_sent(sim: SimCluster, since: int = 0) -> list[Campaign]:
    return [m for _, _, m in sim.sent[since:] if isinstance(m, Campaign)]


def booted(*names: str, **clocks: int) -> SimCluster:
    sim = SimCluster()
    for name in names:
        sim.add(name, clock=clocks.get(name, 0))
    sim.mesh(*names)
    sim.start(*names)
    sim.settle()
    return sim


def test_three_nodes_boot_together_and_elect_one_master() -> None:
    sim = booted("a", "b", "c")
    session = sim.converged()
    assert session == Session(1, NodeId("c"))  # equal clocks and seniority: the highest id
    assert sim.now == CONFIG.boot_grace  # decided the moment the grace ended
    for node in "abc":
        [decided] = [n for n in sim.notes[NodeId(node)] if isinstance(n, Decided)]
        assert decided.latency == 0.0
        assert sim.decided[NodeId(node)] == [session]
        assert sim.persisted[NodeId(node)] == 1
    assert sim.cores[NodeId("c")].seniority == 3


def test_the_highest_persisted_clock_leads_the_boot_round() -> None:
    sim = booted("a", "b", "c", a=7, c=2)
    # Everyone learned 7 from the hellos, so all campaign for 8: the highest id wins.
    assert sim.converged() == Session(8, NodeId("c"))
    assert {c.statistics().rounds for c in sim.cores.values()} == {1}


def test_master_loss_elects_a_new_master_among_the_survivors_at_once() -> None:
    sim = booted("a", "b", "c", "d")
    assert sim.converged().master_id == NodeId("d")
    lost_at = sim.now = 10.0
    sim.crash("d")
    sim.settle()
    session = sim.converged()
    assert session == Session(2, NodeId("c"))
    assert sim.now == lost_at  # every survivor answered at once: no window waited out
    for node in "abc":
        reasons = {n.reason for n in sim.notes[NodeId(node)] if isinstance(n, CampaignStarted)}
        assert CampaignReason.MASTER_LOST in reasons or node != "a"


def test_a_long_lived_master_keeps_winning_against_newcomers() -> None:
    sim = booted("a", "b")  # b wins round 1 with seniority 2
    sim.add("z")
    sim.link("z", "a")
    sim.link("z", "b")
    sim.start("z")
    sim.settle()
    assert sim.converged() == Session(1, NodeId("b"))
    sim.crash("a")  # a follower leaves: no round
    sim.settle()
    assert sim.converged() == Session(1, NodeId("b"))


def test_a_fourth_node_joining_keeps_the_master_and_the_clock() -> None:
    sim = booted("a", "b", "c")
    before = sim.converged()
    mark = len(sim.sent)
    sim.add("d")
    for other in "abc":
        sim.link("d", other)
    sim.start("d")
    sim.settle()
    assert sim.converged() == before
    assert campaigns_sent(sim, mark) == []
    assert sim.decided[NodeId("a")] == [before]  # the cluster's generation was never swapped


def test_a_node_linked_after_its_boot_grace_yields_to_the_cluster() -> None:
    sim = booted("a", "b", "c")
    before = sim.converged()
    sim.add("z", clock=40)
    sim.start("z")
    sim.settle()  # alone: it elects itself
    assert sim.session("z") == Session(41, NodeId("z"))
    mark = len(sim.sent)
    for other in "abc":
        sim.link("z", other)
    sim.settle()
    assert sim.converged() == before
    assert campaigns_sent(sim, mark) == []
    assert sim.cores[NodeId("a")].clock == 41  # the cluster learned z's clock


def test_split_brain_merge_converges_on_one_master() -> None:
    sim = SimCluster()
    for name in "abcd":
        sim.add(name)
    sim.mesh("a", "b")
    sim.mesh("c", "d")
    sim.start(*"abcd")
    sim.settle()
    assert sim.session("a") == sim.session("b") == Session(1, NodeId("b"))
    assert sim.session("c") == sim.session("d") == Session(1, NodeId("d"))
    assert sim.masters() == [NodeId("b"), NodeId("d")]
    sim.now = 5.0
    for x in "ab":
        for y in "cd":
            sim.link(x, y)
    sim.settle()
    session = sim.converged()
    assert session.clock == 2  # max of both + 1
    assert session.master_id == NodeId("d")  # equal seniority 2: the higher id
    merges = [
        n
        for notes in sim.notes.values()
        for n in notes
        if isinstance(n, CampaignStarted) and n.reason is CampaignReason.MERGE
    ]
    assert merges
    assert not sim.cores[NodeId("b")].is_master  # the losing side's master demoted itself
    assert sim.decided[NodeId("b")][-1] == session


def test_force_master_wins_the_boot_round_and_every_later_one() -> None:
    sim = SimCluster()
    sim.add("a", force_master=True)
    sim.add("b", clock=3, commands_seen=100)
    sim.add("c", commands_seen=50)
    sim.mesh("a", "b", "c")
    sim.start("a", "b", "c")
    sim.settle()
    assert sim.converged() == Session(4, NodeId("a"))


def test_a_restarted_master_makes_way_for_a_new_session() -> None:
    sim = booted("a", "b", "c")
    assert sim.converged() == Session(1, NodeId("c"))
    sim.now = 3.0
    sim.crash("c")
    sim.settle()
    assert sim.converged() == Session(2, NodeId("b"))
    sim.add("c", clock=sim.persisted[NodeId("c")])
    sim.link("c", "a")
    sim.link("c", "b")
    sim.start("c")
    sim.settle()
    assert sim.converged() == Session(2, NodeId("b"))
    assert sim.persisted[NodeId("c")] == 2
