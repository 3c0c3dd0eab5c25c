"""Hostile election clocks: a peer's absurd clock is dropped, no node moves its clock more
than a step per message or past the largest clock every peer can decode, and the cluster
keeps (or finds again) one master. Honest nodes far apart still converge, a step per
exchange."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from trexo.config import MAX_JSON_INT_DIGITS, ElectionConfig
from trexo.election.clock_store import CLOCK_FILE, load_clock, store_clock
from trexo.election.core import ElectionCore
from trexo.election.outputs import Dropped
from trexo.net.router import Envelope
from trexo.net.topics import Topic
from trexo.types.election import Announce, Campaign, Candidacy, Hello
from trexo.types.ids import NodeId
from trexo.types.session import Session

from .sim import SimCluster
from .test_service import converged, harness

CONFIG = ElectionConfig(boot_grace=0.3, campaign_window=0.5)
STEP = CONFIG.max_clock_step
ABSURD = 10**20 - 1
"""The largest integer a peer's decoder accepts (20 digits): one more is 21 digits."""
A, B, M, X = (NodeId(n) for n in ("a", "b", "m", "x"))


def follower(clock: int = 1) -> ElectionCore:
    """Node a, following master m's session `clock`, linked to m and to x (the rogue)."""
    core = ElectionCore(A, clock=clock, config=CONFIG)
    core.start(0.0, frozenset({M, X}))
    core.receive(0.0, M, Announce(Candidacy(clock, 0, 0, M)))
    assert core.session == Session(clock, M)
    return core


def test_the_bounds_leave_room_to_count_past_them() -> None:
    assert len(str(CONFIG.max_clock + 1)) <= MAX_JSON_INT_DIGITS
    assert 1 <= STEP < CONFIG.max_clock


@pytest.mark.parametrize(
    "message",
    [
        Hello(clock=ABSURD, session=None),
        Hello(clock=1, session=Candidacy(ABSURD, 0, 0, X)),
        Campaign(Candidacy(ABSURD, 0, 0, X)),
        Announce(Candidacy(ABSURD, 0, 0, X)),
    ],
    ids=["hello-clock", "hello-session", "campaign", "announce"],
)
def test_a_clock_beyond_the_step_is_dropped_and_moves_the_node_a_step_at_most(
    message: object,
) -> None:
    core = follower()
    out = core.receive(1.0, X, message)
    assert [n for n in out.notes if isinstance(n, Dropped)], out.notes
    assert core.clock <= 1 + STEP
    assert out.clock is None or out.clock <= 1 + STEP
    assert core.session == Session(1, M)  # the session stands
    assert core.statistics().campaigning is None  # no round for an absurd clock
    # The sender is asked again: an honest peer far ahead is caught up with, a step a time.
    assert any(isinstance(o.message, Hello) and o.message.answer_me for o in out.messages)


def test_a_clock_within_the_step_is_learned_as_before() -> None:
    core = follower()
    out = core.receive(1.0, X, Hello(clock=1 + STEP, session=None))
    assert not [n for n in out.notes if isinstance(n, Dropped)]
    assert core.clock == out.clock == 1 + STEP


def test_no_clock_goes_past_the_largest_every_peer_decodes() -> None:
    near_top = CONFIG.max_clock - 1
    core = follower(near_top)
    out = core.receive(1.0, X, Hello(clock=CONFIG.max_clock + 1, session=None))
    assert [n for n in out.notes if isinstance(n, Dropped)]
    assert core.clock <= CONFIG.max_clock


def test_a_node_at_the_largest_clock_campaigns_without_passing_it() -> None:
    core = ElectionCore(A, clock=CONFIG.max_clock, config=CONFIG)
    core.start(0.0, frozenset())
    out = core.timer(CONFIG.boot_grace)
    assert core.session is not None and core.session.clock == CONFIG.max_clock
    assert out.clock is None and core.clock == CONFIG.max_clock


def test_an_absurd_clock_sent_to_one_node_does_not_split_the_cluster() -> None:
    sim = SimCluster()
    for name in "abc":
        sim.add(name)
    sim.mesh("a", "b", "c")
    sim.start("a", "b", "c")
    sim.settle()
    first = sim.converged()
    # A rogue peer tells a an absurd clock (as the router would deliver it from x).
    sim.cores[A].receive(sim.now, X, Hello(clock=ABSURD, session=None))
    sim.cores[A].receive(sim.now, X, Campaign(Candidacy(ABSURD, 0, 0, X)))
    sim.settle()
    assert sim.converged() == first
    sim.now += 10.0
    sim.crash(first.master_id)  # the next election still works, with a sane clock
    sim.settle()
    second = sim.converged()
    assert second.clock <= first.clock + 2 * STEP + 1
    assert all(clock <= first.clock + 2 * STEP + 1 for clock in sim.persisted.values())


def test_honest_nodes_far_apart_converge_a_step_per_exchange() -> None:
    # A node that lost its clock meets a cluster many steps ahead (or a rogue peer pushed
    # one node ahead of the others a step at a time): it catches up and follows it.
    far = 5 * STEP + 7
    sim = SimCluster()
    sim.add("a", clock=far)
    sim.add("b", clock=far)
    sim.mesh("a", "b")
    sim.start("a", "b")
    sim.settle()
    session = sim.converged()
    assert session.clock == far + 1
    sim.add("c")  # clock 0
    sim.link("c", "a")
    sim.link("c", "b")
    sim.start("c")
    sim.settle()
    assert sim.converged() == session
    assert sim.persisted[NodeId("c")] == far + 1


def test_a_stored_clock_out_of_range_reads_as_none(tmp_path: Path) -> None:
    for text in (f"{ABSURD}\n", "-3\n", "12abc\n", "\xff\xfe", "9" * 5000, ""):
        (tmp_path / CLOCK_FILE).write_text(text, errors="surrogateescape")
        assert load_clock(tmp_path) == 0, text
    (tmp_path / CLOCK_FILE).unlink()
    (tmp_path / CLOCK_FILE).mkdir()  # not even a file: the restart goes on from 0
    assert load_clock(tmp_path) == 0


def test_an_unbounded_clock_is_never_stored(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        store_clock(tmp_path, ABSURD)
    with pytest.raises(ValueError):
        store_clock(tmp_path, -1)
    assert not (tmp_path / CLOCK_FILE).exists()
    store_clock(tmp_path, 7)
    assert load_clock(tmp_path) == 7


async def test_the_service_drops_an_absurd_clock_with_a_log_line_and_stores_a_bounded_one(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trexo.election")
    async with harness(tmp_path) as h:
        h.mesh("a", "b")
        a = await h.start("a")
        await h.start("b")
        first = await converged(h.group("a", "b"))
        await a.router.deliver(Envelope(Topic.ELECTION, X, Hello(clock=ABSURD, session=None)))
        await trio.sleep(1.0)
        assert load_clock(a.data_dir) <= first.clock + STEP
        dropped = [r for r in caplog.records if "dropped election message from x" in r.getMessage()]
        assert len(dropped) == 1
        h.stop("b" if first.master_id == NodeId("b") else "a")
        survivor = "a" if first.master_id == NodeId("b") else "b"
        second = await converged(h.group(survivor))
        assert second.clock <= first.clock + STEP + 1
