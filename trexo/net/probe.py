"""Indirect probes: asking other nodes whether they hear a peer this node finds silent.

SWIM's answer to a slow path or a slow prober: before a silent peer is declared lost, other
members are asked to reach it. Here a node whose link to P has been silent past
`suspect_after` asks up to `PROBE_FANOUT` other linked nodes `Probe(about=P, ask=True)`;
each answers at once from its own link to P (`Probe(about=P, ask=False, heard_ago=...)`, no
new ping: its heartbeats keep that figure fresh). A reply that heard P within
`suspect_after` vouches for P: the asker's link to P then closes only past
`vouched_lost_after` (the peer is alive; the link alone may be broken). A frozen or cut-off
peer is heard by no one, and its links close past `lost_after` as before.
"""

from __future__ import annotations

import attrs

from trexo.types.ids import NodeId

PROBE_FANOUT = 3
"""Other nodes asked about one suspect (SWIM's k)."""


@attrs.frozen
class Probe:
    """A question about a peer (`ask`), or its answer."""

    about: NodeId
    ask: bool
    heard_ago: float | None = None
    """In an answer: seconds since the answering node last heard `about`; None: it has no
    link to it."""
