"""Envelopes on a peer link: one JSON object each, sealed into one websocket binary message by
the link (`secure_channel`) (pure logic).

    {"topic": "election", "sender": "<node id>", "payload": {"type": "Campaign", ...}}

The payload is the topic's union (`payload_type`) as tagged JSON. Two more topics are the
link's own and never reach the router: `peers` carries gossip (`PeerList`) and `probe`
indirect probes (`Probe`), both for the transport. Decoding raises only `WireError`s: the
link drops the message and logs why.
"""

from __future__ import annotations

import json

from trexo import safe_json, wire
from trexo.errors import FrameTooLarge, MalformedMessage
from trexo.net.gossip import PeerList
from trexo.net.probe import Probe
from trexo.net.router import Envelope
from trexo.net.topics import Topic, payload_type
from trexo.types.ids import NodeId

PEERS_TOPIC = "peers"
"""The link-level topic of gossip; not a router `Topic`."""
PROBE_TOPIC = "probe"
"""The link-level topic of indirect probes (`trexo.net.probe`); not a router `Topic`."""
ENVELOPE_FIELDS = frozenset({"topic", "sender", "payload"})


def encode_envelope(envelope: Envelope) -> str:
    """The message for a router envelope (ASCII JSON)."""
    payload = wire.to_json(envelope.payload, payload_type(envelope.topic)).decode()
    return _frame(envelope.topic.value, envelope.sender, payload)


def encode_peer_list(sender: NodeId, peers: PeerList) -> str:
    """The message for a gossip list (ASCII JSON)."""
    return _frame(PEERS_TOPIC, sender, wire.to_json(peers, PeerList).decode())


def encode_probe(sender: NodeId, probe: Probe) -> str:
    """The message for an indirect probe or its answer (ASCII JSON)."""
    return _frame(PROBE_TOPIC, sender, wire.to_json(probe, Probe).decode())


def _frame(topic: str, sender: NodeId, payload_json: str) -> str:
    # Spliced rather than re-parsed: the payload is already JSON from the converter.
    return f'{{"topic":{json.dumps(topic)},"sender":{json.dumps(sender)},"payload":{payload_json}}}'


def decode_message(
    message: str | bytes, *, sender: NodeId, max_bytes: int
) -> Envelope | PeerList | Probe:
    """Decode one message (opened: the link has checked it came from peer `sender`)."""
    # Our JSON is ASCII (json.dumps escapes the rest), so characters count bytes.
    if len(message) > max_bytes:
        raise FrameTooLarge(f"message of {len(message)} bytes exceeds the limit of {max_bytes}")
    raw = safe_json.loads(message)
    if not isinstance(raw, dict) or raw.keys() != ENVELOPE_FIELDS:
        raise MalformedMessage(
            f"not an envelope: expected an object with {sorted(ENVELOPE_FIELDS)}"
        )
    if raw["sender"] != sender:
        raise MalformedMessage(
            f"envelope sender {safe_json.excerpt(raw['sender'])} is not the peer {sender!r}"
        )
    topic_name = raw["topic"]
    if topic_name == PEERS_TOPIC:
        peers: PeerList = wire.structure(raw["payload"], PeerList)
        return peers
    if topic_name == PROBE_TOPIC:
        probe: Probe = wire.structure(raw["payload"], Probe)
        return probe
    try:
        topic = Topic(topic_name)
    except ValueError:
        raise MalformedMessage(f"unknown topic {safe_json.excerpt(topic_name)}") from None
    return Envelope(topic, sender, wire.structure(raw["payload"], payload_type(topic)))
