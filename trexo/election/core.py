"""The election as a pure state machine (README, Architecture): no I/O, no clock of its own.

Inputs are method calls that carry `now`; each returns an `Outputs` (messages to send, the
new session if it changed, the clock to persist, the next timer deadline). The I/O shell is
`trexo.election.service.Election`; tests drive this class directly with explicit times.

Rules, in short:

- Candidacies are ordered by `(clock, seniority, commands_seen, node_id)`; the highest wins.
- Only boot (no peer told us a live session within `boot_grace`), losing the master's link,
  or a split-brain merge (a link comes up between nodes with different masters) starts a
  campaign, for `clock + 1`. A node that hears a campaign newer than its round (or, with no
  round, its session) joins it; an older one is answered with what the node knows (its own
  campaign, or its session and clock), so a straggler catches up.
- A round ends as soon as every linked peer has sent its candidacy for the round's clock,
  or after `campaign_window`; the node decides the highest candidacy it holds from a node
  still linked. The winner announces; an `Announce` is authoritative: it ends the rounds it
  reaches, replaces a session this node merely decided, and of two announced claims for
  one clock the higher candidacy stands, the same way on every node.
- Link-up `Hello`s carry each side's clock (so a restarted node learns the cluster's) and
  session: a booting node adopts a session whose master it is linked to; a node that
  elected itself alone (a *solo* session, nobody else holds it) yields to a cluster it
  meets instead of forcing a merge round on it; a follower follows its master when the
  master's own hello shows it has moved on (yielded, or restarted: then it campaigns).
- A round started because the master's link went down names that master (`lost_master`
  in every `Campaign` of the round; joiners copy it). The named node, on hearing such a
  campaign, knows the cluster declared it dead: it demotes itself (seniority 0, it drops a
  session it is master of) and takes part with that low candidacy. No node decides the
  lost master the winner of such a round (unless it is all the round holds), so the old
  master cannot win back the cluster that replaced it, and adopts the new master.
- Clocks come from peers, so they are bounded: a message whose clocks run more than
  `max_clock_step` ahead of the highest clock this node knows (or past `max_clock`) is
  dropped. The node then moves its own clock up by the step and asks the sender for its
  hello again: a node far behind honest peers (it lost its clock file, or a hostile peer
  pushed one node ahead of the rest a step at a time) catches up a step per exchange,
  while no message moves any clock by more than the step.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from trexo.config import ElectionConfig
from trexo.election.outputs import (
    Adopted,
    CampaignReason,
    CampaignStarted,
    Decided,
    Dropped,
    Ignored,
    Note,
    Outgoing,
    Outputs,
)
from trexo.types.election import Announce, Campaign, Candidacy, ElectionMessage, Hello
from trexo.types.ids import NodeId
from trexo.types.session import Session


def _no_commands() -> int:
    return 0


@attrs.frozen
class ElectionStatistics:
    """A snapshot of one node's election, in the style of trio's `statistics()` objects."""

    session: Session | None
    clock: int
    seniority: int
    campaigning: int | None
    """The clock of the round in progress, if any."""
    rounds: int
    """Rounds this node took part in: started, joined, or moved up to by a newer one."""
    decisions: int
    """Rounds this node ended by deciding itself (not by adopting an announced result)."""
    adoptions: int
    """Sessions taken from other nodes (an announce, or a peer's hello on joining)."""
    last_decision_latency: float | None
    """Seconds from the start of the last campaign to its end on this node."""


@attrs.define
class _Round:
    clock: int
    reason: CampaignReason
    started_at: float
    """When the campaign began: kept when a newer round supersedes it, for the latency."""
    deadline: float
    candidacies: dict[NodeId, Candidacy]
    """Candidacies for `clock` heard so far, this node's own included."""
    lost_master: NodeId | None = None
    """The master whose loss started this round (ours, or the campaign we joined)."""

    def campaign(self, node_id: NodeId) -> Campaign:
        """This node's `Campaign` for the round."""
        return Campaign(self.candidacies[node_id], lost_master=self.lost_master)


class _Step:
    """What one input produced, collected until `ElectionCore._finish` freezes it."""

    def __init__(self, session: Session | None, clock: int) -> None:
        self.session_before = session
        self.clock_before = clock
        self.messages: list[Outgoing] = []
        self.notes: list[Note] = []
        self.published_campaign = False

    def publish(self, message: ElectionMessage) -> None:
        self.messages.append(Outgoing(message))
        if isinstance(message, Campaign):
            self.published_campaign = True

    def send(self, peer: NodeId, message: ElectionMessage) -> None:
        outgoing = Outgoing(message, to=peer)
        if outgoing not in self.messages:  # one input can have several reasons to say it
            self.messages.append(outgoing)


class ElectionCore:
    """One node's election state. Not thread-safe; the shell feeds it from one task."""

    def __init__(
        self,
        node_id: NodeId,
        *,
        clock: int = 0,
        config: ElectionConfig | None = None,
        commands_seen: Callable[[], int] = _no_commands,
        force_master: bool = False,
    ) -> None:
        self.node_id = node_id
        self.config = config if config is not None else ElectionConfig()
        # A query, not I/O: sampled whenever this node makes a candidacy.
        self._commands_seen = commands_seen
        self.clock = clock
        """The highest clock this node knows (persisted by the shell on every change)."""
        self.seniority = self.config.force_master_seniority if force_master else 0
        self.peers: frozenset[NodeId] = frozenset()
        self._winner: Candidacy | None = None  # the candidacy that won the current session
        self._confirmed = False  # the winner announced it (or told us itself)
        self._solo = False  # we are master and nobody else can hold our session
        self._demoted = False  # a campaign declared us dead; until we follow a master again
        self._round: _Round | None = None
        self._boot_deadline: float | None = None
        self._started = False
        self._heard: dict[NodeId, Hello] = {}  # each peer's last hello, re-weighed on link-up
        self._rounds = 0
        self._decisions = 0
        self._adoptions = 0
        self._last_latency: float | None = None

    # --- reading ----------------------------------------------------------------------------

    @property
    def session(self) -> Session | None:
        return self._winner.session if self._winner is not None else None

    @property
    def is_master(self) -> bool:
        return self._winner is not None and self._winner.node_id == self.node_id

    @property
    def deadline(self) -> float | None:
        """When `timer` must be called next, if ever."""
        if self._round is not None:
            return self._round.deadline
        return self._boot_deadline if self._winner is None else None

    def statistics(self) -> ElectionStatistics:
        return ElectionStatistics(
            session=self.session,
            clock=self.clock,
            seniority=self.seniority,
            campaigning=self._round.clock if self._round is not None else None,
            rounds=self._rounds,
            decisions=self._decisions,
            adoptions=self._adoptions,
            last_decision_latency=self._last_latency,
        )

    # --- inputs -----------------------------------------------------------------------------

    def start(self, now: float, peers: frozenset[NodeId]) -> Outputs:
        """Boot: ask the linked peers for their session, and wait `boot_grace` for one."""
        if self._started:
            raise RuntimeError("ElectionCore.start called twice")
        self._started = True
        step = self._begin()
        self.peers = peers - {self.node_id}
        self._boot_deadline = now + self.config.boot_grace
        for peer in sorted(self.peers):
            # Their link-up hellos may have come before we listened: ask them again.
            self._introduce(step, peer, answer_me=True)
        return self._finish(step)

    def peers_changed(self, now: float, peers: frozenset[NodeId]) -> Outputs:
        """The set of linked peers is now `peers`."""
        step = self._begin()
        new = peers - {self.node_id}
        added, removed = new - self.peers, self.peers - new
        self.peers = new
        for peer in removed:
            self._heard.pop(peer, None)
        for peer in sorted(added):
            self._introduce(step, peer, answer_me=False)
        session = self.session
        if self._round is not None:
            self._check_round(now, step)  # a lost peer no longer needs to answer
        elif session is not None and session.master_id in removed:
            self._campaign(now, CampaignReason.MASTER_LOST, step, lost_master=session.master_id)
        elif added:
            self._reweigh_heard(now, added, step)
        return self._finish(step)

    def receive(self, now: float, sender: NodeId, message: object) -> Outputs:
        """A message arrived on the election topic from `sender`."""
        step = self._begin()
        if sender == self.node_id:
            pass  # our own broadcast, delivered back to us by the router
        elif (reason := self._clock_out_of_bounds(message)) is not None:
            step.notes.append(Dropped(sender, message, reason))
            self._learn_clock(min(self.clock + self.config.max_clock_step, self.config.max_clock))
            step.send(sender, self._hello(answer_me=True))
        elif isinstance(message, Campaign):
            self._on_campaign(now, sender, message, step)
        elif isinstance(message, Announce):
            self._on_announce(now, sender, message, step)
        elif isinstance(message, Hello):
            self._on_hello(now, sender, message, step)
        else:
            step.notes.append(Dropped(sender, message, "not an election message"))
        return self._finish(step)

    def timer(self, now: float) -> Outputs:
        """The deadline has come: end the round with what it has, or campaign after boot."""
        step = self._begin()
        round_ = self._round
        if round_ is not None:
            if now >= round_.deadline:
                self._decide(now, step)
        elif (
            self._winner is None and self._boot_deadline is not None and now >= self._boot_deadline
        ):
            self._campaign(now, CampaignReason.BOOT, step)
        return self._finish(step)

    # --- messages ---------------------------------------------------------------------------

    def _on_campaign(self, now: float, sender: NodeId, message: Campaign, step: _Step) -> None:
        candidacy = message.candidacy
        if candidacy.node_id != sender:
            step.notes.append(Dropped(sender, message, "a candidacy for another node"))
            return
        if message.lost_master == self.node_id and candidacy.clock >= self._epoch:
            self._demote()
        lost = message.lost_master
        round_ = self._round
        if round_ is not None:
            if candidacy.clock < round_.clock:
                # A straggler: bring it into our round (it joins, being older).
                step.send(sender, round_.campaign(self.node_id))
                step.notes.append(Ignored(sender, message, f"older than round {round_.clock}"))
                return
            if candidacy.clock > round_.clock:
                self._enter_round(
                    now, candidacy.clock, CampaignReason.JOINED, sender, step, lost_master=lost
                )
            elif round_.lost_master is None and lost is not None:
                round_.lost_master = lost  # the same round, started for a lost master too
            if lost == self.node_id:
                self._lower_candidacy(step)
        elif candidacy.clock > self._epoch:
            self._enter_round(
                now, candidacy.clock, CampaignReason.JOINED, sender, step, lost_master=lost
            )
        else:
            # That round is over here (or never mattered): tell the sender how it ended.
            step.send(sender, self._hello(answer_me=False))
            if self._winner is not None and self.is_master:
                step.send(sender, Announce(self._winner))
            step.notes.append(Ignored(sender, message, f"not newer than session {self._epoch}"))
            return
        assert self._round is not None
        self._round.candidacies[sender] = candidacy
        self._check_round(now, step)

    def _on_announce(self, now: float, sender: NodeId, message: Announce, step: _Step) -> None:
        winner = message.winner
        if winner.node_id != sender:
            step.notes.append(Dropped(sender, message, "an announce for another node"))
            return
        self._learn_clock(winner.clock)
        if sender not in self.peers:
            # Adopting a master we have no link to would hide its loss from us.
            step.notes.append(Ignored(sender, message, "the announcing master is not linked"))
            return
        current = self._winner
        if self._round is not None:
            if winner.clock < self._round.clock:
                step.notes.append(Ignored(sender, message, "older than our round"))
            else:
                self._adopt(now, winner, sender, step, confirmed=True)
        elif current is None or winner.clock > current.clock:
            self._adopt(now, winner, sender, step, confirmed=True)
        elif winner.clock < current.clock:
            step.notes.append(Ignored(sender, message, "older than our session"))
        elif winner.node_id == current.node_id:
            self._confirmed = True
        elif not self._confirmed or winner > current:
            # Two claims for one clock: the higher candidacy wins, on every node alike.
            self._adopt(now, winner, sender, step, confirmed=True)
        else:
            step.notes.append(Ignored(sender, message, "a lower claim for our session's clock"))
            if self.is_master:
                step.send(sender, Announce(current))  # so the pretender demotes itself

    def _on_hello(self, now: float, sender: NodeId, message: Hello, step: _Step) -> None:
        self._heard[sender] = message
        offered = message.session
        self._learn_clock(message.clock)
        if offered is not None:
            self._learn_clock(offered.clock)
        self._weigh_hello(now, sender, message, step)
        if message.answer_me:
            self._introduce(step, sender, answer_me=False)

    def _weigh_hello(self, now: float, sender: NodeId, message: Hello, step: _Step) -> None:
        """Compare the sender's session with ours: adopt, yield, merge, or leave it."""
        offered = message.session
        current = self._winner
        if self._round is not None:
            # A node that has a session as new as our round decided it already.
            if (
                offered is not None
                and offered.clock >= self._round.clock
                and self._is_linked(offered.node_id)
            ):
                self._adopt_told(now, offered, sender, step)
            return
        if current is None:
            if offered is None:
                return  # a booting peer too: the boot grace decides
            if offered.node_id == self.node_id:
                # We restarted, but the cluster still has us as its master: we are not.
                self._campaign(now, CampaignReason.MASTER_LOST, step)
            elif self._is_linked(offered.node_id):
                self._adopt_told(now, offered, sender, step)
            return
        if sender == current.node_id != self.node_id and offered != current:
            # Our master no longer leads our session (it yielded, or restarted): follow it.
            if offered is not None and self._is_linked(offered.node_id):
                self._adopt_told(now, offered, sender, step)
            else:
                self._campaign(now, CampaignReason.MASTER_LOST, step)
            return
        if offered is None or offered == current:
            # The peer holds (or, booting, will adopt) our session: it is not ours alone.
            if self._solo:
                self._solo = False
                self._tell_everyone(step)  # whoever heard us claim solo must hear otherwise
            return
        if offered.node_id == current.node_id:
            # One master, two of its sessions: the newer one stands.
            if offered.clock > current.clock and self._is_linked(offered.node_id):
                self._adopt_told(now, offered, sender, step)
            elif offered.clock < current.clock:
                step.send(sender, self._hello(answer_me=False))
            return
        theirs_solo = message.solo and offered.node_id == sender
        if self._solo and (not theirs_solo or offered > current):
            # We elected ourselves alone and met a cluster: join it rather than merge.
            if self._is_linked(offered.node_id):
                self._adopt_told(now, offered, sender, step)
            return  # else weighed again when its master's link comes up
        if theirs_solo and (not self._solo or current > offered):
            step.notes.append(Ignored(sender, message, "its solo session yields to ours"))
            return
        if offered.clock < current.clock and offered.node_id != self.node_id:
            # Maybe stale (it may have moved on since): let it judge with what we know.
            step.send(sender, self._hello(answer_me=False))
            return
        # Two masters (or a peer still following us after we stepped down): one round for all.
        self._campaign(now, CampaignReason.MERGE, step)

    def _adopt_told(self, now: float, offered: Candidacy, sender: NodeId, step: _Step) -> None:
        """Adopt a session a peer told us of, and tell every peer: our master learns that
        its session is not solo any more, and whoever heard an older claim from us updates."""
        self._adopt(now, offered, sender, step, confirmed=offered.node_id == sender)
        self._tell_everyone(step)

    def _tell_everyone(self, step: _Step) -> None:
        for peer in sorted(self.peers):
            step.send(peer, self._hello(answer_me=False))

    def _reweigh_heard(self, now: float, added: frozenset[NodeId], step: _Step) -> None:
        """A hello may name a master whose link came up only after it (links come up on
        each side at slightly different times): weigh it again once that link is up."""
        if self._round is not None or not (self._winner is None or self._solo):
            return
        for sender, hello in sorted(self._heard.items()):
            if hello.session is not None and hello.session.node_id in added:
                self._weigh_hello(now, sender, hello, step)
                if self._winner is not None and not self._solo:
                    return

    # --- rounds -----------------------------------------------------------------------------

    @property
    def _epoch(self) -> int:
        """The clock of the round (or else the session) this node is in; -1 for none."""
        if self._round is not None:
            return self._round.clock
        return self._winner.clock if self._winner is not None else -1

    def _campaign(
        self,
        now: float,
        reason: CampaignReason,
        step: _Step,
        *,
        lost_master: NodeId | None = None,
    ) -> None:
        # At the top (a peer spent 2**43 messages getting there) rounds stop being new
        # rather than go past what peers decode.
        clock = min(self.clock + 1, self.config.max_clock)
        self._enter_round(now, clock, reason, self.node_id, step, lost_master=lost_master)
        self._check_round(now, step)  # alone, it is decided at once

    def _demote(self) -> None:
        """The cluster declared this node dead (a campaign names it the lost master): it
        is master no more, and its seniority must not win the round that replaces it.

        Nor the rounds after it until it follows a master again: woken into a half-linked
        cluster, it may campaign among the nodes it still reaches, and there the commands
        it saw as master would outrank theirs and win the cluster back at the merge."""
        self.seniority = 0
        self._demoted = True
        if self.is_master:
            self._winner = None
            self._confirmed = False
            self._solo = False

    def _lower_candidacy(self, step: _Step) -> None:
        """Our round already holds our candidacy with the seniority we lost: replace it."""
        round_ = self._round
        assert round_ is not None
        mine = round_.candidacies[self.node_id]
        if mine.seniority > self.seniority:
            round_.candidacies[self.node_id] = attrs.evolve(mine, seniority=self.seniority)
            step.publish(round_.campaign(self.node_id))

    def _enter_round(
        self,
        now: float,
        clock: int,
        reason: CampaignReason,
        origin: NodeId,
        step: _Step,
        *,
        lost_master: NodeId | None = None,
    ) -> None:
        started_at = self._round.started_at if self._round is not None else now
        seen = 0 if self._demoted else self._commands_seen()
        mine = Candidacy(clock, self.seniority, seen, self.node_id)
        self._round = _Round(
            clock=clock,
            reason=reason,
            started_at=started_at,
            deadline=now + self.config.campaign_window,
            candidacies={self.node_id: mine},
            lost_master=lost_master,
        )
        self._learn_clock(clock)
        self._boot_deadline = None
        self._rounds += 1
        step.publish(self._round.campaign(self.node_id))
        step.notes.append(CampaignStarted(clock, reason, origin))

    def _check_round(self, now: float, step: _Step) -> None:
        if self._round is not None and self.peers.issubset(self._round.candidacies):
            self._decide(now, step)

    def _decide(self, now: float, step: _Step) -> None:
        round_ = self._round
        assert round_ is not None
        # A peer that left after answering can be no master: only linked nodes count.
        held = [
            candidacy
            for node, candidacy in round_.candidacies.items()
            if node == self.node_id or node in self.peers
        ]
        # The cluster declared the round's lost master dead: it cannot win the round back.
        eligible = [c for c in held if c.node_id != round_.lost_master]
        winner = max(eligible or held)
        latency = now - round_.started_at
        self._round = None
        self._winner = winner
        self._decisions += 1
        self._last_latency = latency
        if winner.node_id == self.node_id:
            # A long-lived master keeps winning ties against newcomers.
            self.seniority = max(self.seniority, len(held))
            self._confirmed = True
            self._solo = len(held) == 1 and not self.peers
            step.publish(Announce(winner))
        else:
            self._confirmed = False  # until the winner's announce arrives
            self._solo = False
        step.notes.append(Decided(winner.session, winner, len(held), latency))

    def _adopt(
        self, now: float, winner: Candidacy, source: NodeId, step: _Step, *, confirmed: bool
    ) -> None:
        latency = None
        if self._round is not None:
            latency = now - self._round.started_at
            self._last_latency = latency
        self._round = None
        self._boot_deadline = None
        self._winner = winner
        self._confirmed = confirmed
        self._solo = False
        self._demoted = False  # it follows a master again
        self._adoptions += 1
        self._learn_clock(winner.clock)
        step.notes.append(Adopted(winner.session, source, latency))

    # --- helpers ----------------------------------------------------------------------------

    def _clock_out_of_bounds(self, message: object) -> str | None:
        """Why `message`'s clocks are more than this node can take from one message, if so."""
        highest = max(message_clocks(message), default=None)
        if highest is None:
            return None
        cfg = self.config
        if highest > cfg.max_clock:
            return f"clock {highest} is past the largest clock, {cfg.max_clock}"
        if highest > self.clock + cfg.max_clock_step:
            return (
                f"clock {highest} is more than {cfg.max_clock_step} ahead of this node's "
                f"{self.clock} (this node moves up a step and asks again)"
            )
        return None

    def _is_linked(self, node: NodeId) -> bool:
        return node in self.peers

    def _learn_clock(self, clock: int) -> None:
        self.clock = max(self.clock, clock)

    def _hello(self, *, answer_me: bool) -> Hello:
        return Hello(
            clock=self.clock,
            session=self._winner,
            solo=self._solo and self.is_master,
            answer_me=answer_me,
        )

    def _introduce(self, step: _Step, peer: NodeId, *, answer_me: bool) -> None:
        """Tell a (newly linked) peer our session, and bring it into our round if we have one."""
        step.send(peer, self._hello(answer_me=answer_me))
        round_ = self._round
        if round_ is not None and peer not in round_.candidacies and not step.published_campaign:
            step.send(peer, round_.campaign(self.node_id))

    def _begin(self) -> _Step:
        return _Step(self.session, self.clock)

    def _finish(self, step: _Step) -> Outputs:
        session = self.session
        return Outputs(
            messages=tuple(step.messages),
            session=session if session != step.session_before else None,
            clock=self.clock if self.clock != step.clock_before else None,
            notes=tuple(step.notes),
            deadline=self.deadline,
        )


def message_clocks(message: object) -> tuple[int, ...]:
    """The clocks an election message asks its receiver to take in."""
    match message:
        case Campaign(candidacy=candidacy):
            return (candidacy.clock,)
        case Announce(winner=winner):
            return (winner.clock,)
        case Hello(clock=clock, session=None):
            return (clock,)
        case Hello(clock=clock, session=Candidacy(clock=session_clock)):
            return (clock, session_clock)
    return ()
