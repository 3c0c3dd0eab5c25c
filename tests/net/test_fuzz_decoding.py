"""Hostile input to a peer link's decoders: envelopes (`decode_message`), the handshake over
a real websocket on 127.0.0.1, and a linked node. Only `WireError`s come out of decoding,
only `PeerRefused`/`DialFailed` out of a handshake, and the node keeps working."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

import pytest
import trio
from hostile_json import (
    deep,
    hostile_bytes,
    hostile_text,
    nest,
    shaped_like,
    values,
    with_known_killers,
)
from hypothesis import example, given, settings
from hypothesis import strategies as st
from raw_websocket import INVALID_FRAMES, RawWebSocket
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket, serve_websocket

from trexo.errors import DialFailed, FrameTooLarge, PeerRefused, WireError
from trexo.net import handshake as hs
from trexo.net.codec import PEERS_TOPIC, decode_message, encode_envelope
from trexo.net.gossip import PeerList
from trexo.net.handshake_io import accept_handshake, dial_handshake
from trexo.net.router import Envelope
from trexo.net.topics import Topic, payload_type
from trexo.types.ids import NodeId, RequestId
from trexo.types.stream import StreamFailed

from .helpers import TEST_TIMEOUT_S, fake_peer, logged, quiet_websocket_logs, start_node, wait_peers

SENDER = NodeId("fake")
MAX_BYTES = 1 << 20
TOPICS = [topic.value for topic in Topic]
ME = hs.Identity(NodeId("me"), "trexo", 1, 52416)
HANDSHAKE_EXAMPLES = 30
"""Each example opens a real server and connection; fewer, so the suite stays quick."""


def envelope(topic: str, payload_json: str, sender: str = SENDER) -> str:
    return f'{{"topic":{json.dumps(topic)},"sender":{json.dumps(sender)},"payload":{payload_json}}}'


def decodes_or_refuses(message: str | bytes, max_bytes: int = MAX_BYTES) -> None:
    with contextlib.suppress(WireError):
        decode_message(message, sender=SENDER, max_bytes=max_bytes)


# --- envelopes -------------------------------------------------------------------------------

topic_names = st.sampled_from([*TOPICS, PEERS_TOPIC]) | st.text(max_size=10)


@given(message=hostile_text)
@with_known_killers("message")
def test_hostile_messages_give_only_wire_errors(message: str) -> None:
    decodes_or_refuses(message)


@given(message=hostile_bytes)
def test_binary_messages_give_only_wire_errors(message: bytes) -> None:
    decodes_or_refuses(message)


@given(topic=topic_names, payload=hostile_text)
@example(topic="stream", payload=nest(1_000))
def test_envelopes_of_hostile_payloads_give_only_wire_errors(topic: str, payload: str) -> None:
    decodes_or_refuses(envelope(topic, payload))


@given(data=st.data(), topic=st.sampled_from(list(Topic)))
def test_envelopes_of_well_tagged_bad_payloads_give_only_wire_errors(
    data: st.DataObject, topic: Topic
) -> None:
    decodes_or_refuses(envelope(topic.value, data.draw(shaped_like(payload_type(topic)))))


@given(peers=values, sender=values)
def test_odd_gossip_and_senders_give_only_wire_errors(peers: Any, sender: Any) -> None:
    decodes_or_refuses(envelope(PEERS_TOPIC, json.dumps({"peers": peers})))
    decodes_or_refuses(f'{{"topic":"stream","sender":{json.dumps(sender)},"payload":{{}}}}')


@given(message=hostile_text)
def test_oversize_messages_are_refused_by_size(message: str) -> None:
    try:
        decode_message(message, sender=SENDER, max_bytes=10)
    except FrameTooLarge:
        assert len(message) > 10
    except WireError:
        assert len(message) <= 10


@given(payload=deep)
def test_deep_payloads_in_a_valid_envelope_are_refused(payload: str) -> None:
    with pytest.raises(WireError, match="not valid JSON"):
        decode_message(envelope("stream", payload), sender=SENDER, max_bytes=1 << 22)


def test_good_envelopes_still_decode() -> None:
    good = Envelope(Topic.STREAM, SENDER, StreamFailed(RequestId("r"), "fine"))
    assert decode_message(encode_envelope(good), sender=SENDER, max_bytes=MAX_BYTES) == good
    gossip = envelope(PEERS_TOPIC, '{"peers": [{"node_id": "n", "host": "h", "port": 1}]}')
    peers = decode_message(gossip, sender=SENDER, max_bytes=MAX_BYTES)
    assert isinstance(peers, PeerList)
    assert peers.peers[0].port == 1


# --- the handshake over a real websocket ------------------------------------------------------


def handshake_texts() -> st.SearchStrategy[str]:
    return hostile_text | shaped_like(hs.HandshakeMessage)


@settings(max_examples=HANDSHAKE_EXAMPLES)
@given(first=handshake_texts())
@with_known_killers("first")
def test_the_acceptor_refuses_any_hostile_first_message(first: str) -> None:
    outcomes: list[Exception] = []
    decided = trio.Event()

    async def handler(request: Any) -> None:
        ws = await request.accept()
        try:
            await accept_handshake(ws, ME, ())
        except (PeerRefused, DialFailed) as exc:  # anything else fails the test
            outcomes.append(exc)
            decided.set()
        await ws.aclose()

    async def main() -> None:
        with trio.fail_after(TEST_TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
                port = server.port
                async with open_websocket("127.0.0.1", port, "/trexo", use_ssl=False) as ws:
                    await ws.send_message(first)
                    try:
                        while True:
                            await ws.get_message()
                    except ConnectionClosed:
                        pass
                with trio.fail_after(2):
                    await decided.wait()
                nursery.cancel_scope.cancel()

    quiet_websocket_logs()
    trio.run(main)
    [outcome] = outcomes
    if isinstance(outcome, PeerRefused):
        assert not outcome.by_peer
        assert len(outcome.reason) < 1_000  # however large the message was


@settings(max_examples=HANDSHAKE_EXAMPLES)
@given(reply=handshake_texts())
@with_known_killers("reply")
def test_the_dialler_refuses_any_hostile_reply(reply: str) -> None:
    async def handler(request: Any) -> None:
        ws = await request.accept()
        try:
            await ws.get_message()  # their hello
            await ws.send_message(reply)
            while True:
                await ws.get_message()
        except ConnectionClosed:
            pass

    async def main() -> None:
        with trio.fail_after(TEST_TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
                async with open_websocket("127.0.0.1", server.port, "/trexo", use_ssl=False) as ws:
                    with trio.fail_after(2), pytest.raises((PeerRefused, DialFailed)):
                        await dial_handshake(ws, ME, ())
                nursery.cancel_scope.cancel()

    quiet_websocket_logs()
    trio.run(main)


# --- a linked node -------------------------------------------------------------------------

GOOD = StreamFailed(RequestId("r1"), "fine")
HOSTILE_AFTER_HANDSHAKE = [
    (nest(1_000), "nested deeper than 64"),  # the ~2 KB message that killed a node
    (nest(100_000, "[", closed=False), "nested deeper than 64"),
    (nest(512 * 1024, '{"a":', "1"), "nested deeper than 64"),  # ~3 MB
    (envelope("stream", nest(200)), "nested deeper than 64"),
    (envelope("stream", "9" * 100_000), "digits"),
    (envelope("election", '{"type": "Campaign", "x": 1e999999}'), "out of range"),
    (envelope("stream", '{"type": NaN}'), "NaN is not valid JSON"),
    (envelope("stream", '{"type": "StreamFailed", "request_id": "\\ud800"}'), "lone surrogate"),
    (envelope("stream", '{"type": ["StreamFailed"]}'), "'type' is ['StreamFailed']"),
    (envelope("commands", '{"type": {}}'), "'type' is {}"),
    (envelope(["stream"], "{}"), "unknown topic"),  # type: ignore[arg-type]
]


async def test_a_linked_node_drops_hostile_messages_and_keeps_working(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trexo.net")
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a", max_message_bytes=4 << 20)
            with a.router.subscribe(Topic.STREAM) as inbox:
                async with fake_peer(a, "fake") as ws:
                    await wait_peers(a.router, ["fake"])
                    for message, _ in HOSTILE_AFTER_HANDSHAKE:
                        await ws.send_message(message)
                    # Gossip of peers that cannot be dialled: a host IDNA cannot encode, a
                    # port past 2**63 (each used to crash the transport when dialled).
                    bad_peers = [
                        {"node_id": "zz1", "host": "h" * 100, "port": 1},
                        {"node_id": "zz2", "host": "127.0.0.1", "port": 10**19},
                        {"node_id": "zz3", "host": "127.0.0.1", "port": -1},
                    ]
                    await ws.send_message(envelope(PEERS_TOPIC, json.dumps({"peers": bad_peers})))
                    good = Envelope(Topic.STREAM, NodeId("fake"), GOOD)
                    await ws.send_message(encode_envelope(good))
                    with trio.fail_after(5):
                        assert await inbox.receive() == good  # the rest was dropped, in order
                    for _, problem in HOSTILE_AFTER_HANDSHAKE:
                        assert logged(caplog, "dropped a message from peer fake", problem), problem
                    assert a.router.peers == {"fake"}
            c = await start_node(nursery, "c")
            assert await c.connect(a) == "a"  # the transport still takes new links
            nursery.cancel_scope.cancel()


# --- the upgrade and the websocket protocol --------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/x", "/trexo/", "/trexo?x=1", "/TREXO", "//trexo"])
async def test_an_upgrade_on_another_path_is_refused(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trexo.net")
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a")
            with pytest.raises(ConnectionRejected) as info:
                async with open_websocket("127.0.0.1", a.port, path, use_ssl=False):
                    pass
            assert info.value.status_code == 404
            assert logged(caplog, "refused a websocket upgrade", repr(path))
            async with fake_peer(a, "fine"):  # the right path still works
                await wait_peers(a.router, ["fine"])
            nursery.cancel_scope.cancel()


BROKEN_PROTOCOL = {1002, 1007, None}
"""How the node ends a connection after an invalid frame: a close frame saying protocol
error or invalid payload, or (when its close frame is lost to the reset) none. Not 4002 or
4003, as a heartbeat or handshake timeout would."""


@pytest.mark.parametrize("after_handshake", [False, True], ids=["before", "after"])
@pytest.mark.parametrize("name", sorted(INVALID_FRAMES))
async def test_an_invalid_frame_closes_the_connection_at_once(
    name: str, after_handshake: bool
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            # A handshake timeout far above the bound below: closing must not wait for it.
            a = await start_node(nursery, "a", handshake_timeout=TEST_TIMEOUT_S)
            raw = await RawWebSocket.connect(a.port)
            assert await raw.upgrade() == 101
            if after_handshake:
                await raw.handshake("raw")
                await wait_peers(a.router, ["raw"])
            await raw.send_raw(INVALID_FRAMES[name])
            with trio.fail_after(2):
                code = await raw.close_code()
            assert code in BROKEN_PROTOCOL
            await raw.aclose()
            await wait_peers(a.router, [])
            nursery.cancel_scope.cancel()
