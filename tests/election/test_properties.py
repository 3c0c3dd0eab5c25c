"""Property tests: whatever the delivery order, a settled cluster has one session, one master.

Messages on one link keep their order; everything else (which link delivers next, when each
side of a link learns of it, in which order due timers fire) is chosen by hypothesis.
"""

from __future__ import annotations

import os
import random
from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trexo.types.election import Announce
from trexo.types.ids import NodeId

from .sim import SimCluster, randomly

NAMES = "abcdefgh"
SETTINGS = settings(
    max_examples=int(os.environ.get("ELECTION_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

clocks = st.integers(min_value=0, max_value=6)
commands = st.integers(min_value=0, max_value=3)


def node_specs(min_size: int, max_size: int) -> st.SearchStrategy[list[tuple[int, int]]]:
    return st.lists(st.tuples(clocks, commands), min_size=min_size, max_size=max_size)


def build(specs: list[tuple[int, int]]) -> tuple[SimCluster, list[str]]:
    sim = SimCluster()
    names = list(NAMES[: len(specs)])
    for name, (clock, seen) in zip(names, specs, strict=True):
        sim.add(name, clock=clock, commands_seen=seen)
    return sim, names


def assert_one_master_per_clock(sim: SimCluster) -> None:
    """Of the claims still standing, no clock has two masters."""
    masters: dict[int, set[NodeId]] = defaultdict(set)
    for node, core in sim.cores.items():
        if core.is_master and core.session is not None:
            masters[core.session.clock].add(node)
    assert all(len(m) == 1 for m in masters.values()), dict(masters)


@SETTINGS
@given(specs=node_specs(2, 5), rng=st.randoms(use_true_random=False))
def test_after_master_loss_all_survivors_decide_the_same_session(
    specs: list[tuple[int, int]], rng: random.Random
) -> None:
    sim, names = build(specs)
    sim.mesh(*names)
    sim.start(*names)
    sim.settle(randomly(rng))
    first = sim.converged()
    assert_one_master_per_clock(sim)

    sim.now += 10.0
    sim.crash(first.master_id)
    sim.settle(randomly(rng))
    if len(names) == 1:
        return
    second = sim.converged()
    assert second.clock > first.clock
    assert second.master_id != first.master_id
    assert second.master_id in sim.cores
    assert_one_master_per_clock(sim)


@SETTINGS
@given(
    specs=node_specs(2, 6),
    split=st.integers(min_value=1, max_value=5),
    rng=st.randoms(use_true_random=False),
)
def test_a_healed_partition_ends_with_one_master(
    specs: list[tuple[int, int]], split: int, rng: random.Random
) -> None:
    sim, names = build(specs)
    split = min(split, len(names) - 1)
    left, right = names[:split], names[split:]
    sim.mesh(*left)
    sim.mesh(*right)
    sim.start(*names)
    sim.settle(randomly(rng))  # two partitions, two masters (of different sessions)

    sim.now += 10.0
    for x in left:
        for y in right:
            sim.link(x, y)
    sim.settle(randomly(rng))
    sim.converged()
    assert_one_master_per_clock(sim)


@SETTINGS
@given(
    specs=node_specs(2, 5),
    link_times=st.lists(st.floats(min_value=0.0, max_value=2.0), min_size=10, max_size=10),
    rng=st.randoms(use_true_random=False),
)
def test_links_coming_up_at_any_time_around_boot_end_with_one_master(
    specs: list[tuple[int, int]], link_times: list[float], rng: random.Random
) -> None:
    """Links come up one by one, some before and some after the boot grace."""
    sim, names = build(specs)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    schedule = sorted(zip(link_times, pairs, strict=False))
    sim.start(*names)
    for at, (a, b) in schedule:
        sim.advance(max(0.0, at - sim.now), randomly(rng))
        sim.link(a, b)
    sim.settle(randomly(rng))
    sim.converged()


@SETTINGS
@given(specs=node_specs(3, 5), rng=st.randoms(use_true_random=False))
def test_settled_rounds_leave_at_most_one_announced_master_standing(
    specs: list[tuple[int, int]], rng: random.Random
) -> None:
    """Boot, lose the master, lose the next one: each settled round has one master."""
    sim, names = build(specs)
    sim.mesh(*names)
    sim.start(*names)
    for _ in range(2):
        sim.settle(randomly(rng))
        session = sim.converged()
        announced = {
            m.winner.node_id
            for _, _, m in sim.sent
            if isinstance(m, Announce) and m.winner.clock == session.clock
        }
        assert session.master_id in announced
        sim.now += 10.0
        sim.crash(session.master_id)


operations = st.lists(
    st.tuples(
        st.sampled_from(["link", "unlink", "crash", "restart", "wait"]),
        st.integers(min_value=0, max_value=4),
        st.integers(min_value=0, max_value=4),
        st.floats(min_value=0.0, max_value=1.0),
    ),
    max_size=12,
)


@SETTINGS
@given(specs=node_specs(2, 5), ops=operations, rng=st.randoms(use_true_random=False))
def test_after_any_churn_a_full_mesh_settles_on_one_master(
    specs: list[tuple[int, int]],
    ops: list[tuple[str, int, int, float]],
    rng: random.Random,
) -> None:
    """Links up and down, crashes and restarts (with the persisted clock), at random times;
    once every node is back and linked to every other, one session and one master remain."""
    sim, names = build(specs)
    sim.start(*names)
    down: list[str] = []
    for op, i, j, wait in ops:
        x, y = names[i % len(names)], names[j % len(names)]
        alive = NodeId(x) in sim.cores and NodeId(y) in sim.cores
        if op == "link" and x != y and alive:
            sim.link(x, y)
        elif op == "unlink" and x != y and alive:
            sim.unlink(x, y)
        elif op == "crash" and NodeId(x) in sim.cores:
            sim.crash(x)
            down.append(x)
        elif op == "restart" and down:
            name = down.pop(0)
            sim.add(name, clock=sim.persisted[NodeId(name)])
            sim.start(name)
        sim.advance(wait, randomly(rng))
    for name in down:
        sim.add(name, clock=sim.persisted[NodeId(name)])
        sim.start(name)
    alive_names = names
    for i, x in enumerate(alive_names):
        for y in alive_names[i + 1 :]:
            if frozenset({NodeId(x), NodeId(y)}) not in sim.links:
                sim.link(x, y)
    sim.settle(randomly(rng))
    sim.converged()
    for node in alive_names:
        assert sim.persisted[NodeId(node)] == sim.cores[NodeId(node)].clock
