"""What the election core asks of its I/O shell after each input, and what it reports.

The core never does I/O: each input returns an `Outputs` that says what to broadcast and
what to send to one peer, which session is now current, when to call the core's timer next, and
`notes` (campaigns, decisions, adoptions, dropped messages) for the shell to log.
"""

from __future__ import annotations

import enum

import attrs

from trexo.types.election import Candidacy, ElectionMessage
from trexo.types.ids import NodeId
from trexo.types.session import Session


class CampaignReason(enum.Enum):
    """Why this node is in a round. Only these start one (README, Architecture)."""

    BOOT = "boot"
    """No peer told us a live session within the boot grace."""
    MASTER_LOST = "master lost"
    """The master's link went down, or the cluster still names us master after a restart."""
    MERGE = "merge"
    """A link came up between two nodes with different masters: a split brain heals."""
    JOINED = "joined"
    """Another node's campaign for a newer clock than ours: we take part in its round."""


@attrs.frozen
class CampaignStarted:
    """This node entered round `clock` (its own campaign, or one it joined)."""

    clock: int
    reason: CampaignReason
    origin: NodeId
    """Who started the round: this node, or the peer whose campaign it joined."""


@attrs.frozen
class Decided:
    """This node ended round `session.clock` itself, with the highest candidacy it heard."""

    session: Session
    winner: Candidacy
    participants: int
    latency: float
    """Seconds from the start of the campaign (the first of superseding rounds) to now."""


@attrs.frozen
class Adopted:
    """This node took a session another node decided (announced, or told on link-up)."""

    session: Session
    source: NodeId
    latency: float | None
    """Seconds since its campaign started, when the adoption ended one; else None."""


@attrs.frozen
class Dropped:
    """A message that breaks the protocol (not merely a stale one); the shell logs it."""

    sender: NodeId
    message: object
    reason: str


@attrs.frozen
class Ignored:
    """A well-formed message with nothing to act on (an older round, for instance)."""

    sender: NodeId
    message: object
    reason: str


Note = CampaignStarted | Decided | Adopted | Dropped | Ignored


@attrs.frozen
class Outgoing:
    """One message to send: to every linked peer (`to` is None), or to one peer."""

    message: ElectionMessage
    to: NodeId | None = None


@attrs.frozen
class Outputs:
    """The shell's orders after one input."""

    messages: tuple[Outgoing, ...] = ()
    """In this order: a peer must see a round's `Campaign` before its `Announce`."""
    session: Session | None = None
    """The new current session, when this input changed it."""
    clock: int | None = None
    """The node's clock, when this input changed it: persist it before sending anything."""
    notes: tuple[Note, ...] = ()
    deadline: float | None = None
    """When to call the core's `timer` next (None: no timer is due)."""
