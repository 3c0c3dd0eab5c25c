"""Multicast discovery beacons: what a node announces and whom it answers (pure logic)."""

from __future__ import annotations

import attrs

from trexo import wire
from trexo.errors import MalformedMessage
from trexo.types.ids import NodeId

MAX_BEACON_BYTES = 1024
"""A beacon is a few dozen bytes; anything longer on the discovery port is not one."""


@attrs.frozen
class Beacon:
    """'A node of `namespace` listens for peers on `port` of the address this came from.'"""

    namespace: str
    node_id: NodeId
    port: int
    version: int


def encode_beacon(beacon: Beacon) -> bytes:
    return wire.to_json(beacon, Beacon)


def decode_beacon(data: bytes) -> Beacon:
    """The beacon in a datagram, or `MalformedMessage`."""
    if len(data) > MAX_BEACON_BYTES:
        raise MalformedMessage(f"datagram of {len(data)} bytes is too long for a beacon")
    beacon: Beacon = wire.from_json(data, Beacon)
    return beacon


def worth_dialling(beacon: Beacon, *, node_id: NodeId, namespace: str, version: int) -> bool:
    """Whether a heard beacon names another node of our cluster (our own come back to us on
    the loopback; other namespaces share the group; another version would be refused)."""
    return beacon.namespace == namespace and beacon.node_id != node_id and beacon.version == version
