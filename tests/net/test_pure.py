"""Pure pieces of the transport: envelopes, duplicates, garbage, gossip, beacons, config."""

from __future__ import annotations

import json
from contextlib import suppress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trexo.config import DiscoveryConfig, TransportConfig
from trexo.errors import FrameTooLarge, MalformedMessage
from trexo.net.beacon import Beacon, decode_beacon, encode_beacon, worth_dialling
from trexo.net.codec import decode_message, encode_envelope, encode_peer_list
from trexo.net.duplicates import LinkKey, keep_new
from trexo.net.garbage import GarbageMeter
from trexo.net.gossip import PeerInfo, PeerList, peer_lists, should_dial
from trexo.net.router import Envelope
from trexo.net.topics import Topic
from trexo.types.election import Campaign, Candidacy
from trexo.types.ids import NodeId, RequestId
from trexo.types.refusal import RefusalKind
from trexo.types.stream import CommandReply, StreamFailed

A, B, C = NodeId("a"), NodeId("b"), NodeId("c")


# --- codec -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "envelope",
    [
        Envelope(Topic.ELECTION, A, Campaign(Candidacy(1, 2, 3, A))),
        Envelope(Topic.STREAM, A, StreamFailed(RequestId("r"), "unicode: é ✓")),
        Envelope(Topic.STREAM, A, CommandReply("c", error="no", error_kind=RefusalKind.INVALID)),
    ],
)
def test_envelopes_round_trip(envelope: Envelope) -> None:
    text = encode_envelope(envelope)
    assert text.isascii()  # so the size check counts bytes
    assert decode_message(text, sender=A, max_bytes=10_000) == envelope


def test_peer_lists_round_trip() -> None:
    peers = PeerList((PeerInfo(B, "10.0.0.2", 52416), PeerInfo(C, "10.0.0.3", 1)))
    text = encode_peer_list(A, peers)
    assert json.loads(text)["topic"] == "peers"
    assert decode_message(text, sender=A, max_bytes=10_000) == peers


@pytest.mark.parametrize(
    ("message", "error", "problem"),
    [
        (b"\xff\xfe", MalformedMessage, "UTF-8"),
        ("{", MalformedMessage, "not valid JSON"),
        ('"str"', MalformedMessage, "not an envelope"),
        ('{"topic": "stream", "sender": "a"}', MalformedMessage, "not an envelope"),
        ('{"topic": "x", "sender": "a", "payload": {}}', MalformedMessage, "unknown topic"),
        ('{"topic": "stream", "sender": "b", "payload": {}}', MalformedMessage, "not the peer"),
        ('{"topic": "stream", "sender": "a", "payload": 3}', MalformedMessage, "StreamItem"),
        ('{"topic": "peers", "sender": "a", "payload": {"peers": 3}}', MalformedMessage, "Peer"),
        (
            '{"topic": "stream", "sender": "a", "payload": "' + "x" * 200 + '"}',
            FrameTooLarge,
            "limit",
        ),
    ],
)
def test_bad_messages_raise_wire_errors(
    message: str | bytes, error: type[Exception], problem: str
) -> None:
    with pytest.raises(error, match=problem):
        decode_message(message, sender=A, max_bytes=100)


@given(st.text(max_size=200) | st.binary(max_size=200))
def test_decoding_never_raises_anything_but_wire_errors(message: str | bytes) -> None:
    with suppress(MalformedMessage, FrameTooLarge):
        decode_message(message, sender=A, max_bytes=150)


# --- duplicates --------------------------------------------------------------------------


def test_the_smaller_dialler_wins_whichever_arrives_first() -> None:
    by_a, by_b = LinkKey(A, "ff"), LinkKey(B, "00")
    assert keep_new(existing=by_b, new=by_a)
    assert not keep_new(existing=by_a, new=by_b)


@given(st.text(min_size=1), st.text(min_size=1))
def test_two_dials_by_one_node_are_ordered_too(n1: str, n2: str) -> None:
    k1, k2 = LinkKey(A, n1), LinkKey(A, n2)
    if n1 != n2:
        # Exactly one of them replaces the other, the same way at both ends.
        assert keep_new(k1, k2) != keep_new(k2, k1)


# --- garbage -----------------------------------------------------------------------------


def test_garbage_meter_counts_within_the_window() -> None:
    meter = GarbageMeter(limit=3, window=10.0)
    assert not any(meter.record(t) for t in (0.0, 1.0, 2.0))
    assert meter.record(3.0)  # the fourth within 10 s
    meter = GarbageMeter(limit=3, window=10.0)
    for t in (0.0, 5.0, 11.0, 16.0, 22.0):
        assert not meter.record(t)  # never more than three in any 10 s
    assert meter.count(22.0) == 2


# --- gossip ------------------------------------------------------------------------------


def test_only_the_smaller_id_dials_what_it_hears_of() -> None:
    assert should_dial(A, B, linked=[], dialing=[])
    assert not should_dial(B, A, linked=[], dialing=[])
    assert not should_dial(A, A, linked=[], dialing=[])
    assert not should_dial(A, B, linked=[B], dialing=[])
    assert not should_dial(A, B, linked=[], dialing=[B])


def test_each_peer_hears_of_the_others() -> None:
    infos = {n: PeerInfo(n, "127.0.0.1", i) for i, n in enumerate((A, B, C))}
    lists = peer_lists(infos)
    assert lists[A] == PeerList((infos[B], infos[C]))
    assert lists[B] == PeerList((infos[A], infos[C]))
    assert peer_lists({}) == {}


# --- beacons -----------------------------------------------------------------------------


def test_beacons_round_trip_and_filter() -> None:
    beacon = Beacon("trexo", B, 52416, 1)
    assert decode_beacon(encode_beacon(beacon)) == beacon
    assert worth_dialling(beacon, node_id=A, namespace="trexo", version=1)
    assert not worth_dialling(beacon, node_id=B, namespace="trexo", version=1)  # our own
    assert not worth_dialling(beacon, node_id=A, namespace="other", version=1)
    assert not worth_dialling(beacon, node_id=A, namespace="trexo", version=2)
    with pytest.raises(MalformedMessage):
        decode_beacon(b"x" * 2000)
    with pytest.raises(MalformedMessage):
        decode_beacon(b'{"namespace": "trexo"}')


# --- config ------------------------------------------------------------------------------


def test_redial_backoff_grows_to_its_cap() -> None:
    cfg = DiscoveryConfig(redial_initial=0.2, redial_max=5.0, redial_factor=2.0)
    assert [cfg.redial_delay(n) for n in (1, 2, 3)] == [0.2, 0.4, 0.8]
    assert cfg.redial_delay(50) == 5.0


def test_transport_defaults() -> None:
    cfg = TransportConfig()
    assert (cfg.host, cfg.port, cfg.namespace, cfg.secret) == ("0.0.0.0", 52416, "trexo", None)
    assert cfg.frozen_peer_bound <= 2.0
    assert cfg.hard_message_bytes > cfg.max_message_bytes
    assert DiscoveryConfig().discovery_port == 52417
    assert "s3cret" not in repr(TransportConfig(secret=b"s3cret"))
