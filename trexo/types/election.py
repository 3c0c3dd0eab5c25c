"""Election messages (DESIGN §2.3)."""

from __future__ import annotations

import attrs

from trexo.types.ids import NodeId


@attrs.frozen(order=True)
class Candidacy:
    """What a node brings to a campaign. Higher wins, compared field by field."""

    clock: int
    seniority: int
    commands_seen: int
    node_id: NodeId


@attrs.frozen
class Campaign:
    """A node's candidacy for round `clock` (the candidacy's clock)."""

    candidacy: Candidacy


@attrs.frozen
class Announce:
    """The winner of round `clock` announces itself as master."""

    clock: int
    master_id: NodeId
    seniority: int


ElectionMessage = Campaign | Announce
