"""The pure election core, one node at a time, driven with explicit times."""

from __future__ import annotations

from trexo.config import ElectionConfig
from trexo.election.core import ElectionCore
from trexo.election.outputs import (
    Adopted,
    CampaignReason,
    CampaignStarted,
    Decided,
    Dropped,
    Ignored,
    Outgoing,
    Outputs,
)
from trexo.types.election import Announce, Campaign, Candidacy, Hello
from trexo.types.ids import NodeId
from trexo.types.session import Session

CONFIG = ElectionConfig(boot_grace=0.3, campaign_window=0.5)
A, B, C, M, Z = (NodeId(n) for n in "abcmz")


def node(name: NodeId, *, clock: int = 0, commands: int = 0, force: bool = False) -> ElectionCore:
    return ElectionCore(
        name, clock=clock, config=CONFIG, commands_seen=lambda: commands, force_master=force
    )


def cand(clock: int, node_id: NodeId, seniority: int = 0, commands: int = 0) -> Candidacy:
    return Candidacy(clock, seniority, commands, node_id)


def published(out: Outputs) -> list[object]:
    return [o.message for o in out.messages if o.to is None]


def sent_to(out: Outputs, peer: NodeId) -> list[object]:
    return [o.message for o in out.messages if o.to == peer]


def campaigns(out: Outputs) -> list[Campaign]:
    return [o.message for o in out.messages if isinstance(o.message, Campaign)]


def booted_into_round(core: ElectionCore, peers: set[NodeId]) -> Outputs:
    """Start `core` with `peers` linked and let the boot grace run out: a round for clock+1."""
    core.start(0.0, frozenset(peers))
    out = core.timer(CONFIG.boot_grace)
    assert campaigns(out), out
    return out


def settled(core: ElectionCore, session: Candidacy, peers: set[NodeId]) -> ElectionCore:
    """`core` following (or leading) `session`, with `peers` linked."""
    core.start(0.0, frozenset(peers))
    if session.node_id == core.node_id:
        core.timer(CONFIG.boot_grace)
        assert core.session is not None
    else:
        core.receive(0.0, session.node_id, Announce(session))
    assert core.session == session.session, core.session
    return core


# --- ordering ----------------------------------------------------------------------------


def test_candidacies_order_by_clock_then_seniority_then_commands_then_id() -> None:
    assert cand(2, A) > cand(1, Z, seniority=9, commands=9)
    assert cand(1, A, seniority=1) > cand(1, Z, commands=9)
    assert cand(1, A, commands=1) > cand(1, Z)
    assert cand(1, Z) > cand(1, A)


def test_a_peer_with_higher_seniority_wins() -> None:
    z = node(Z)
    booted_into_round(z, {A})
    out = z.receive(0.3, A, Campaign(cand(1, A, seniority=2)))
    assert out.session == Session(1, A)  # despite "z" > "a"
    assert not z.is_master
    assert not [m for m in published(out) if isinstance(m, Announce)]  # only the winner announces


def test_more_commands_seen_breaks_a_tie() -> None:
    z = node(Z, commands=3)
    booted_into_round(z, {A})
    assert z.receive(0.3, A, Campaign(cand(1, A, commands=7))).session == Session(1, A)

    z = node(Z, commands=7)
    booted_into_round(z, {A})
    out = z.receive(0.3, A, Campaign(cand(1, A, commands=3)))
    assert out.session == Session(1, Z)
    assert published(out) == [Announce(cand(1, Z, commands=7))]


def test_force_master_wins_against_more_senior_and_busier_peers() -> None:
    a = node(A, force=True)
    booted_into_round(a, {Z})
    out = a.receive(0.3, Z, Campaign(cand(1, Z, seniority=1000, commands=10**6)))
    assert out.session == Session(1, A)
    assert a.seniority == CONFIG.force_master_seniority


# --- rounds ------------------------------------------------------------------------------


def test_a_message_with_an_older_clock_is_ignored() -> None:
    a = node(A, clock=4)
    booted_into_round(a, {B, C})  # round 5
    out = a.receive(0.3, B, Campaign(cand(3, B, seniority=99)))
    assert out.session is None
    assert any(isinstance(n, Ignored) for n in out.notes)
    # The straggler is shown the current round, which it will join.
    assert sent_to(out, B) == [Campaign(cand(5, A))]
    # An older candidacy does not count towards the round: it still waits for b and c.
    assert a.receive(0.3, C, Campaign(cand(5, C))).session is None
    assert a.receive(0.3, B, Campaign(cand(5, B))).session == Session(5, C)


def test_a_campaign_older_than_the_session_is_answered_with_what_we_know() -> None:
    a = settled(node(A), cand(1, A), set())
    a.peers_changed(1.0, frozenset({B}))
    out = a.receive(1.0, B, Campaign(cand(1, B)))
    assert out.session is None
    assert sent_to(out, B) == [Hello(1, cand(1, A), solo=True), Announce(cand(1, A))]


def test_a_newer_round_supersedes_a_running_one() -> None:
    a = node(A)
    booted_into_round(a, {B, C})  # round 1
    a.receive(0.3, C, Campaign(cand(1, C, seniority=5)))
    out = a.receive(0.4, B, Campaign(cand(3, B)))
    assert CampaignStarted(3, CampaignReason.JOINED, B) in out.notes
    assert published(out) == [Campaign(cand(3, A))]
    assert a.clock == 3
    assert out.clock == 3
    assert out.deadline == 0.4 + CONFIG.campaign_window  # a fresh window for the new clock
    # c's candidacy for round 1 is gone: round 3 waits for c again, and c no longer wins.
    assert out.session is None
    out = a.receive(0.4, C, Campaign(cand(3, C)))
    assert out.session == Session(3, C)
    assert a.statistics().rounds == 2


def test_the_winners_seniority_grows_to_the_number_of_participants() -> None:
    z = node(Z)
    booted_into_round(z, {A, B})
    z.receive(0.3, A, Campaign(cand(1, A)))
    out = z.receive(0.3, B, Campaign(cand(1, B)))
    assert out.session == Session(1, Z)
    assert z.seniority == 3
    # It brings that seniority to the next round.
    out = z.receive(0.5, A, Campaign(cand(2, A)))
    assert published(out) == [Campaign(cand(2, Z, seniority=3))]


def test_early_decision_once_every_linked_peer_answered() -> None:
    a = node(A)
    booted_into_round(a, {B, C})
    assert a.receive(0.3, B, Campaign(cand(1, B))).session is None
    out = a.receive(0.3, C, Campaign(cand(1, C)))
    assert out.session == Session(1, C)
    assert out.deadline is None  # no waiting for the window
    [decided] = [n for n in out.notes if isinstance(n, Decided)]
    assert decided.latency == 0.0
    assert decided.participants == 3
    assert a.statistics().last_decision_latency == 0.0


def test_the_window_bounds_the_wait_for_a_silent_peer() -> None:
    a = node(A)
    out = booted_into_round(a, {B, C})
    assert out.deadline == 0.3 + CONFIG.campaign_window
    a.receive(0.31, B, Campaign(cand(1, B)))
    assert a.timer(0.7).session is None  # too early
    out = a.timer(0.8)
    assert out.session == Session(1, B)  # c never answered; the highest heard wins
    [decided] = [n for n in out.notes if isinstance(n, Decided)]
    assert decided.participants == 2
    assert abs(decided.latency - CONFIG.campaign_window) < 1e-9


def test_a_peer_lost_mid_campaign_no_longer_blocks_the_decision() -> None:
    a = node(A)
    booted_into_round(a, {B, C})
    a.receive(0.3, C, Campaign(cand(1, C)))
    assert a.receive(0.3, B, Campaign(cand(1, B))).session == Session(1, C)

    a = node(A)
    booted_into_round(a, {B, C})
    a.receive(0.3, C, Campaign(cand(1, C)))
    out = a.peers_changed(0.31, frozenset({B}))  # c answered, then left: it cannot be master
    assert out.session is None
    out = a.receive(0.32, B, Campaign(cand(1, B)))
    assert out.session == Session(1, B)

    a = node(A)
    booted_into_round(a, {B, C})
    a.receive(0.3, B, Campaign(cand(1, B)))
    out = a.peers_changed(0.35, frozenset({B}))  # c, silent, is gone: decide now
    assert out.session == Session(1, B)


# --- boot --------------------------------------------------------------------------------


def test_boot_alone_elects_itself_after_the_boot_grace() -> None:
    a = node(A)
    out = a.start(0.0, frozenset())
    assert out.messages == ()
    assert out.deadline == CONFIG.boot_grace
    assert a.timer(0.29).messages == ()
    out = a.timer(0.3)
    assert CampaignStarted(1, CampaignReason.BOOT, A) in out.notes
    assert out.session == Session(1, A)
    assert out.clock == 1  # to persist
    assert published(out) == [Campaign(cand(1, A)), Announce(cand(1, A))]
    assert a.is_master
    assert a.seniority == 1
    assert out.deadline is None


def test_boot_into_a_healthy_cluster_adopts_without_a_campaign() -> None:
    d = node(NodeId("d"))
    out = d.start(0.0, frozenset({A, B, M}))
    assert {o.to for o in out.messages} == {A, B, M}
    assert all(o.message == Hello(0, None, answer_me=True) for o in out.messages)
    healthy = cand(5, M, seniority=3)
    d.receive(0.01, A, Hello(5, healthy))
    assert d.session == Session(5, M)
    out = d.receive(0.01, M, Hello(5, healthy))
    assert out.session is None  # already has it
    assert d.timer(1.0).messages == ()  # the boot grace is over: nothing to do
    assert d.clock == 5
    assert d.statistics().rounds == 0
    assert d.receive(0.02, B, Hello(5, healthy)).notes == ()


def test_boot_waits_for_a_session_whose_master_is_linked() -> None:
    d = node(NodeId("d"))
    d.start(0.0, frozenset({A}))
    out = d.receive(0.01, A, Hello(5, cand(5, M)))  # m is not linked to us (yet)
    assert out.session is None
    assert d.clock == 5  # but the clock is learned
    # m's link comes up (its hello came first: the two sides attach at different times)
    out = d.peers_changed(0.02, frozenset({A, M}))
    assert out.session == Session(5, M)
    assert not campaigns(out)


def test_a_booting_node_asked_by_a_restarted_peer_answers() -> None:
    a = settled(node(A, clock=1), cand(2, A), set())
    a.peers_changed(1.0, frozenset({B}))
    out = a.receive(1.0, B, Hello(0, None, answer_me=True))
    assert sent_to(out, B) == [Hello(2, cand(2, A))]  # not solo any more: b will follow it


def test_a_restarted_master_still_named_by_the_cluster_campaigns_at_once() -> None:
    m = node(M, clock=5)
    m.start(0.0, frozenset({A, B}))
    out = m.receive(0.01, A, Hello(5, cand(5, M, seniority=3)))
    assert CampaignStarted(6, CampaignReason.MASTER_LOST, M) in out.notes
    assert out.session is None


# --- master loss, merge ------------------------------------------------------------------


def test_master_loss_starts_a_campaign_at_once() -> None:
    a = settled(node(A), cand(5, M, seniority=3), {B, M})
    out = a.peers_changed(10.0, frozenset({B}))
    assert CampaignStarted(6, CampaignReason.MASTER_LOST, A) in out.notes
    assert published(out) == [Campaign(cand(6, A), lost_master=M)]
    assert out.deadline == 10.0 + CONFIG.campaign_window
    out = a.receive(10.0, B, Campaign(cand(6, B)))
    assert out.session == Session(6, B)


def test_losing_a_follower_starts_nothing() -> None:
    a = settled(node(A), cand(5, M, seniority=3), {B, M})
    out = a.peers_changed(10.0, frozenset({M}))
    assert out.messages == ()
    assert a.session == Session(5, M)


def test_hello_with_another_master_starts_a_merge_campaign() -> None:
    a = settled(node(A), cand(5, M, seniority=2), {B, M})
    a.peers_changed(1.0, frozenset({B, M, C}))
    out = a.receive(1.0, C, Hello(7, cand(7, C, seniority=2)))
    assert CampaignStarted(8, CampaignReason.MERGE, A) in out.notes  # max of both + 1


def test_a_stale_hello_is_answered_not_merged() -> None:
    a = settled(node(A), cand(5, M, seniority=2), {B, M})
    a.peers_changed(1.0, frozenset({B, M, C}))
    out = a.receive(1.0, C, Hello(5, cand(3, C, seniority=2)))
    assert not campaigns(out)
    assert Hello(5, cand(5, M, seniority=2)) in sent_to(out, C)


def test_a_solo_node_yields_to_the_cluster_it_meets() -> None:
    z = settled(node(Z, clock=9), cand(10, Z), set())  # booted alone: master of nobody else
    assert z.statistics().session == Session(10, Z)
    z.peers_changed(5.0, frozenset({A, M}))
    out = z.receive(5.0, A, Hello(5, cand(5, M, seniority=3)))
    assert out.session == Session(5, M)
    assert not campaigns(out)
    assert z.clock == 10  # its clock stays (and the cluster learns it from z's hello)
    # The cluster side keeps its session: z's solo session yields.
    a = settled(node(A), cand(5, M, seniority=3), {M})
    a.peers_changed(5.0, frozenset({M, Z}))
    out = a.receive(5.0, Z, Hello(10, cand(10, Z, seniority=1), solo=True))
    assert not campaigns(out)
    assert a.session == Session(5, M)
    assert a.clock == 10


def test_of_two_solo_nodes_the_lower_yields() -> None:
    a = settled(node(A), cand(1, A), set())
    b = settled(node(B), cand(1, B), set())
    a.peers_changed(1.0, frozenset({B}))
    b.peers_changed(1.0, frozenset({A}))
    assert a.receive(1.0, B, Hello(1, cand(1, B), solo=True)).session == Session(1, B)
    out = b.receive(1.0, A, Hello(1, cand(1, A), solo=True))
    assert out.session is None
    assert b.is_master


# --- announces ---------------------------------------------------------------------------


def test_an_announce_ends_the_round_it_reaches() -> None:
    a = node(A)
    booted_into_round(a, {B, C})
    out = a.receive(0.31, B, Announce(cand(1, B)))
    assert out.session == Session(1, B)
    assert out.deadline is None
    [adopted] = [n for n in out.notes if isinstance(n, Adopted)]
    assert adopted.latency is not None
    assert abs(adopted.latency - 0.01) < 1e-9


def test_two_claims_for_one_clock_settle_on_the_higher_candidacy() -> None:
    # a decided b (b is highest of what it heard), then hears c's claim and b's.
    a = node(A)
    booted_into_round(a, {B, C})
    a.receive(0.3, B, Campaign(cand(1, B, seniority=2)))
    a.receive(0.3, C, Campaign(cand(1, C)))
    assert a.session == Session(1, B)
    # An announce beats a mere decision of the same clock...
    assert a.receive(0.31, C, Announce(cand(1, C))).session == Session(1, C)
    # ...and of two announced claims the higher candidacy stands, whatever the order.
    assert a.receive(0.32, B, Announce(cand(1, B, seniority=2))).session == Session(1, B)
    assert a.receive(0.33, C, Announce(cand(1, C))).session is None
    assert a.session == Session(1, B)


def test_a_master_shown_a_lower_claim_reasserts_itself() -> None:
    b = node(B)
    booted_into_round(b, {A})
    b.receive(0.3, A, Campaign(cand(1, A)))
    assert b.is_master
    out = b.receive(0.4, A, Announce(cand(1, A)))  # a decided without us, say
    assert b.is_master
    assert sent_to(out, A) == [Announce(cand(1, B, seniority=0))]
    # and the lower claimant (it decided alone: b was silent), shown it, demotes itself
    a = node(A)
    booted_into_round(a, {B})
    assert a.timer(0.8).session == Session(1, A)
    out = a.receive(0.9, B, Announce(cand(1, B)))
    assert out.session == Session(1, B)
    assert not a.is_master


def test_an_announce_from_an_unlinked_master_is_not_adopted() -> None:
    a = node(A)
    a.start(0.0, frozenset({B}))
    out = a.receive(0.1, M, Announce(cand(4, M)))
    assert out.session is None
    assert a.clock == 4


# --- restarts ------------------------------------------------------------------------------


def test_a_restarted_node_with_a_stale_clock_adopts_the_cluster_session() -> None:
    c = node(C, clock=0)
    c.start(0.0, frozenset({A, M}))
    out = c.receive(0.01, M, Hello(7, cand(7, M, seniority=3)))
    assert out.session == Session(7, M)
    assert out.clock == 7  # learned, and persisted
    assert not campaigns(out)
    # Its next campaign is for the cluster's next clock, not for 1.
    out = c.peers_changed(1.0, frozenset({A}))
    assert published(out) == [Campaign(cand(8, C), lost_master=M)]


def test_a_restarted_node_with_a_higher_clock_joins_without_a_new_round() -> None:
    c = node(C, clock=12)  # it was master in a partition, once
    out = c.start(0.0, frozenset({A, M}))
    assert sent_to(out, A) == [Hello(12, None, answer_me=True)]
    out = c.receive(0.01, M, Hello(7, cand(7, M, seniority=3)))
    assert out.session == Session(7, M)
    assert not campaigns(out)
    assert c.clock == 12
    # The cluster learns its clock from that hello and keeps its session.
    a = settled(node(A), cand(7, M, seniority=3), {M})
    a.peers_changed(1.0, frozenset({M, C}))
    out = a.receive(1.0, C, Hello(12, None, answer_me=True))
    assert a.session == Session(7, M)
    assert not campaigns(out)
    assert out.clock == 12
    # and its next round, when it comes, is above every clock anyone knew
    out = a.peers_changed(2.0, frozenset({C}))
    assert published(out) == [Campaign(cand(13, A), lost_master=M)]


# --- a master the cluster declared dead ----------------------------------------------------


def _deliver(
    nodes: dict[NodeId, ElectionCore],
    queue: list[tuple[NodeId, Outputs]],
    now: float,
) -> None:
    """Deliver every message in `queue`, and what it causes, over the links both ends see."""
    while queue:
        sender, out = queue.pop(0)
        for outgoing in out.messages:
            targets = [outgoing.to] if outgoing.to is not None else sorted(nodes[sender].peers)
            for target in targets:
                if target in nodes[sender].peers and sender in nodes[target].peers:
                    queue.append((target, nodes[target].receive(now, sender, outgoing.message)))


def elected(core: ElectionCore, peers: set[NodeId]) -> ElectionCore:
    """`core` master of clock 1, elected by all of `peers` (so its seniority counts them)."""
    booted_into_round(core, peers)
    for peer in sorted(peers):
        core.receive(CONFIG.boot_grace, peer, Campaign(cand(1, peer)))
    assert core.is_master and core.seniority == len(peers) + 1
    return core


def test_a_master_declared_lost_demotes_itself_and_adopts_its_replacement() -> None:
    # n0 was elected by all three: seniority 3. B has seen the most commands of the rest.
    m = elected(node(M, commands=9), {A, B})
    a = settled(node(A, commands=1), cand(1, M), {B, M})
    b = settled(node(B, commands=5), cand(1, M), {A, M})
    nodes = {M: m, A: a, B: b}
    # M froze: B's heartbeat declared it lost, A's has not fired yet; M still sees both.
    out_b = b.peers_changed(10.0, frozenset({A}))
    assert published(out_b) == [Campaign(cand(2, B, commands=5), lost_master=M)]
    # A joins clock 2 and names the lost master too.
    out_a = a.receive(10.1, B, published(out_b)[0])
    assert published(out_a) == [Campaign(cand(2, A, commands=1), lost_master=M)]
    # B holds every linked candidacy: it decides itself.
    assert b.receive(10.1, A, published(out_a)[0]).session == Session(2, B)
    # M thaws and hears A's campaign: it demotes itself and cannot win the round.
    out_m = m.receive(10.2, A, published(out_a)[0])
    assert m.seniority == 0
    assert not m.is_master
    assert m.session is None
    # Demoted, its candidacy counts none of the commands it saw as master.
    assert campaigns(out_m) == [Campaign(cand(2, M, commands=0), lost_master=M)]
    assert not any(isinstance(o.message, Announce) for o in out_m.messages)
    # A, holding all three candidacies, decides B (not M, though M has more commands).
    out_a2 = a.receive(10.2, M, campaigns(out_m)[0])
    assert a.session == Session(2, B)
    _deliver(nodes, [(B, b.receive(10.1, A, published(out_a)[0])), (A, out_a2)], 10.2)
    # M waits for B, whom it still sees linked; the window ends it without M winning.
    out_m = m.timer(10.2 + CONFIG.campaign_window)
    assert not m.is_master
    _deliver(nodes, [(M, out_m)], 10.8)
    # Later the M-B link comes back: everyone ends with B as master, none split.
    queue = [(B, b.peers_changed(11.0, frozenset({A, M})))]
    queue.append((M, m.peers_changed(11.0, frozenset({A, B}))))
    _deliver(nodes, queue, 11.0)
    for _ in range(3):
        for core in nodes.values():
            if core.deadline is not None:
                _deliver(nodes, [(core.node_id, core.timer(core.deadline))], core.deadline)
    assert {core.session.master_id for core in nodes.values() if core.session} == {B}
    assert all(core.session == b.session for core in nodes.values())
    assert not m.is_master


def test_a_master_demoted_can_rise_again_in_a_genuine_election() -> None:
    m = elected(node(M), {A})
    assert m.seniority == 2
    m.receive(1.0, A, Campaign(cand(2, A), lost_master=M))
    assert m.seniority == 0
    assert m.session == Session(2, A)  # round 2 cannot be M's
    # Clock 3 is not about M: it wins it (higher id), and its seniority grows again.
    out = m.receive(2.0, A, Campaign(cand(3, A)))
    assert out.session == Session(3, M)
    assert m.is_master and m.seniority == 2


def test_a_campaign_naming_another_lost_master_does_not_demote() -> None:
    z = elected(node(Z), {A, B})
    out = z.receive(1.0, A, Campaign(cand(2, A), lost_master=M))
    assert z.seniority == 3
    assert campaigns(out) == [Campaign(cand(2, Z, seniority=3), lost_master=M)]
    z.receive(1.0, B, Campaign(cand(2, B), lost_master=M))
    assert z.session == Session(2, Z)
    assert z.is_master


# --- protocol errors -----------------------------------------------------------------------


def test_malformed_and_unexpected_messages_are_dropped_with_a_note() -> None:
    a = node(A)
    a.start(0.0, frozenset({B}))
    for message in (object(), "campaign", Campaign(cand(1, C)), Announce(cand(1, C))):
        out = a.receive(0.1, B, message)
        assert out.messages == ()
        assert out.session is None
        assert [type(n) for n in out.notes] == [Dropped]


def test_own_messages_echoed_by_the_router_are_ignored() -> None:
    a = node(A)
    booted_into_round(a, {B})
    out = a.receive(0.3, A, Campaign(cand(1, A)))
    assert out == Outputs(deadline=0.8)


def test_outgoing_defaults_to_broadcast() -> None:
    assert Outgoing(Hello(0, None)).to is None


def _run_timers(nodes: dict[NodeId, ElectionCore], now: float) -> float:
    for _ in range(8):
        for core in nodes.values():
            if core.deadline is not None:
                now = max(now, core.deadline)
                _deliver(nodes, [(core.node_id, core.timer(core.deadline))], now)
    return now


def test_a_demoted_master_woken_into_a_half_linked_cluster_does_not_win_it_back() -> None:
    # Seen with real processes: M froze; B's heartbeat closed the M-B link and B won clock 2
    # with A. M thawed linked to A only: it demoted itself on A's campaign, decided A (which
    # follows B), campaigned again on A's hello, and won that round among {M, A} on the
    # commands it had seen as master; the merge once M-B linked again kept M.
    m = elected(node(M, commands=9), {A, B})
    a = settled(node(A, commands=1), cand(1, M), {B, M})
    b = settled(node(B, commands=5), cand(1, M), {A, M})
    nodes = {M: m, A: a, B: b}
    # M is frozen: it takes in nothing yet. A and B elect B.
    out_b = b.peers_changed(10.0, frozenset({A}))
    out_a = a.receive(10.0, B, published(out_b)[0])
    for o in b.receive(10.0, A, published(out_a)[0]).messages:
        if o.to in (None, A):
            a.receive(10.0, B, o.message)
    assert a.session == b.session == Session(2, B)
    # M thaws: A's queued campaign, then its end of the M-B link closing.
    queue = [(M, m.receive(10.2, A, o.message)) for o in out_a.messages if o.to in (None, M)]
    queue.append((M, m.peers_changed(10.2, frozenset({A}))))
    _deliver(nodes, queue, 10.2)
    now = _run_timers(nodes, 10.2)
    assert not m.is_master
    # The M-B link comes back: one master for all, B.
    now += 0.1
    queue = [(B, b.peers_changed(now, frozenset({A, M})))]
    queue.append((M, m.peers_changed(now, frozenset({A, B}))))
    _deliver(nodes, queue, now)
    _run_timers(nodes, now)
    assert {core.session for core in nodes.values()} == {b.session}
    assert b.is_master and not m.is_master
