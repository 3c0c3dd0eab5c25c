"""Peer exchange: linked nodes tell each other whom they are linked to (pure logic).

Every change of a node's links makes it send each linked peer the list of its other peers.
A node that hears of a peer it is not linked to dials it, but only if its own id is the
smaller: the larger learns of the smaller the same way and waits to be dialled, so two
nodes that hear of each other do not dial each other at once. A star of static peers
becomes a full mesh this way.

What a peer says about others is only a hint: an address that cannot be a peer's (not an IP
literal, a broadcast or multicast address, a port out of range) is ignored, and what is
left is dialled at a bounded rate (`trexo.net.dial_queue`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping

import attrs

from trexo.safe_json import excerpt
from trexo.types.ids import NodeId


@attrs.frozen
class PeerInfo:
    """How to reach a node: its peer-port address as one of its linked peers sees it."""

    node_id: NodeId
    host: str
    """The address the connection to it came from (or went to): reachable by a neighbour."""
    port: int
    """The peer port it advertised in its hello (not the ephemeral port it dialled from)."""


@attrs.frozen
class PeerList:
    """The link-level message carrying a node's current peers (the recipient left out)."""

    peers: tuple[PeerInfo, ...]


def should_dial(
    self_id: NodeId, peer_id: NodeId, linked: Iterable[NodeId], dialing: Iterable[NodeId]
) -> bool:
    """Whether this node should dial a node it heard of (from gossip or a beacon)."""
    return self_id < peer_id and peer_id not in set(linked) and peer_id not in set(dialing)


def peer_lists(links: Mapping[NodeId, PeerInfo]) -> dict[NodeId, PeerList]:
    """For each linked peer, the list to send it: every other linked peer."""
    return {
        recipient: PeerList(tuple(info for peer, info in links.items() if peer != recipient))
        for recipient in links
    }


MAX_PORT = 65535
_BROADCAST = ipaddress.IPv4Address("255.255.255.255")


def implausible_address(host: str, port: int) -> str | None:
    """Why a gossiped (or beaconed) address cannot be a peer's, if it cannot. A link records
    the IP its connection came from, so a peer's address is an IP literal; a name would be
    looked up, and any address at all dialled, on a peer's say-so."""
    if not 1 <= port <= MAX_PORT:
        return f"port {port} is not within 1..{MAX_PORT}"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return f"{excerpt(host)} is not an IP address"
    if ip.is_unspecified or ip.is_multicast or ip == _BROADCAST:
        return f"{ip} is no single host's address"
    return None
