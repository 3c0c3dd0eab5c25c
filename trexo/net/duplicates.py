"""Which of two connections between the same pair of nodes to keep (pure logic).

Two nodes that dial each other at once end up with two connections. Both ends must keep
the same one without talking about it, so the choice depends only on what both ends know
after the handshake of each: who dialled it, and the dialler's handshake nonce (which
also separates two dials by the same node). The connection with the smaller key is kept:
the one dialled by the smaller node id.
"""

from __future__ import annotations

import attrs

from trexo.types.ids import NodeId


@attrs.frozen(order=True)
class LinkKey:
    """Identifies a connection the same way at both of its ends."""

    dialer: NodeId
    nonce: str
    """The dialler's hello nonce: random, so two dials by one node differ."""


def keep_new(existing: LinkKey, new: LinkKey) -> bool:
    """Whether a newly handshaken connection replaces the existing link to the same peer."""
    return new < existing
