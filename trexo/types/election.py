"""Election messages (README, Architecture), all on the `election` topic.

A round is named by its clock. `Campaign` joins a round, `Announce` claims its result,
and `Hello` is what two nodes tell each other when the link between them comes up.
"""

from __future__ import annotations

import attrs

from trexo.types.ids import NodeId
from trexo.types.session import Session


@attrs.frozen(order=True)
class Candidacy:
    """What a node brings to round `clock`. Higher wins, compared field by field."""

    clock: int
    seniority: int
    commands_seen: int
    node_id: NodeId

    @property
    def session(self) -> Session:
        """The session this candidacy makes if it wins."""
        return Session(self.clock, self.node_id)


@attrs.frozen
class Campaign:
    """The sender's candidacy for round `candidacy.clock` (it started or joined that round)."""

    candidacy: Candidacy
    lost_master: NodeId | None = None
    """The master whose loss started this round, if that is why: the cluster declared it
    dead. A node that reads its own id here demotes itself and cannot win the round."""


@attrs.frozen
class Announce:
    """The winner of round `winner.clock` claims the session; sent by the winner only.

    It carries the whole winning candidacy so that two claims for one clock are settled the
    same way everywhere: the higher candidacy wins.
    """

    winner: Candidacy


@attrs.frozen
class Hello:
    """What the sender knows, told to a peer when their link comes up (or on request)."""

    clock: int
    """The highest clock the sender knows: a restarted node learns the cluster's from it."""
    session: Candidacy | None
    """The candidacy that won the sender's current session; None while it has none."""
    solo: bool = False
    """The sender is master of a session nobody else holds (it elected itself alone)."""
    answer_me: bool = False
    """Reply with a `Hello`: the sender's election just started and may have missed ours."""


ElectionMessage = Campaign | Announce | Hello
