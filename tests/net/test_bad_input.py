"""What peers (or anything else) may send to the peer port without disturbing the node."""

from __future__ import annotations

import json
import logging
import random

import pytest
import trio

from tests.waiting import NotYet, wait_until
from trexo import wire
from trexo.net.codec import encode_envelope
from trexo.net.router import Envelope
from trexo.net.topics import Topic
from trexo.types.ids import NodeId, RequestId
from trexo.types.stream import StreamFailed

from .helpers import (
    TEST_TIMEOUT_S,
    connections_settled,
    fake_peer,
    logged,
    start_node,
    wait_peers,
)

LOG = "trexo.net"


def envelope_text(sender: str, topic: str, payload: object) -> str:
    return json.dumps({"topic": topic, "sender": sender, "payload": payload})


GOOD = StreamFailed(RequestId("r1"), "fine")


async def test_bad_messages_are_dropped_and_the_link_survives(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOG)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a", max_message_bytes=2000)
            with a.router.subscribe(Topic.STREAM) as inbox:
                async with fake_peer(a, "fake") as ws:
                    await wait_peers(a.router, ["fake"])
                    bad = [
                        ("not json", "not valid JSON"),
                        ("[1, 2]", "not an envelope"),
                        (envelope_text("fake", "nonsense", {}), "unknown topic 'nonsense'"),
                        (envelope_text("mallory", "stream", {}), "is not the peer 'fake'"),
                        # a payload of the wrong type for its topic
                        (
                            envelope_text("fake", "stream", {"type": "Campaign", "candidacy": {}}),
                            "invalid StreamItem",
                        ),
                        (
                            envelope_text(
                                "fake", "stream", {"type": "StreamFailed", "request_id": 3}
                            ),
                            "invalid StreamItem",
                        ),
                        (envelope_text("fake", "stream", {"pad": "x" * 3000}), "exceeds the limit"),
                    ]
                    for text, _ in bad:
                        await ws.send_message(text)
                    await ws.send_message(b"\xff\xfe not UTF-8")
                    good = Envelope(Topic.STREAM, NodeId("fake"), GOOD)
                    await ws.send_message(encode_envelope(good))
                    with trio.fail_after(2):
                        got = await inbox.receive()
                    assert got == good  # everything before it was dropped, in order
                    for _, problem in bad:
                        assert logged(caplog, "dropped a message from peer fake", problem), problem
                    assert logged(caplog, "dropped a message from peer fake", "UTF-8")
                    assert a.router.peers == {"fake"}
            nursery.cancel_scope.cancel()


async def test_a_garbage_spewing_peer_is_disconnected(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOG)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a", garbage_limit=5, garbage_window=10.0)
            async with fake_peer(a, "spew") as ws:
                await wait_peers(a.router, ["spew"])
                for _ in range(6):
                    await ws.send_message("garbage")
                await wait_peers(a.router, [], timeout=2.0)
                assert logged(caplog, "disconnecting peer spew", "more than 5 bad messages")
                closed = None
                with trio.fail_after(2):
                    try:
                        while True:
                            await ws.get_message()
                    except Exception as exc:  # ConnectionClosed
                        closed = exc
                assert "1008" in repr(closed)
            nursery.cancel_scope.cancel()


async def test_a_few_bad_messages_are_forgiven() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a", garbage_limit=5, garbage_window=10.0)
            with a.router.subscribe(Topic.STREAM) as inbox:
                async with fake_peer(a, "sloppy") as ws:
                    await wait_peers(a.router, ["sloppy"])
                    for _ in range(5):
                        await ws.send_message("garbage")
                    good = Envelope(Topic.STREAM, NodeId("sloppy"), GOOD)
                    await ws.send_message(encode_envelope(good))
                    # Delivered: the reader got past all five in order, and kept the link.
                    assert await inbox.receive() == good
                    assert a.router.peers == {"sloppy"}
            nursery.cancel_scope.cancel()


async def test_a_message_past_the_hard_limit_closes_the_link() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a", max_message_bytes=1000)
            async with fake_peer(a, "huge") as ws:
                await wait_peers(a.router, ["huge"])
                payload = {"type": "StreamFailed", "request_id": "r", "message": "x" * 10_000}
                await ws.send_message(envelope_text("huge", "stream", payload))
                await wait_peers(a.router, [], timeout=2.0)
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "garbage",
    [
        random.Random(0).randbytes(4096),
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # HTTP, but no websocket upgrade
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),  # a TLS ClientHello
        b"\r\n\r\n\r\n",
    ],
    ids=["random", "plain-http", "tls", "blank-lines"],
)
async def test_raw_garbage_to_the_port_leaves_the_node_working(garbage: bytes) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a", handshake_timeout=0.5)
            b = await start_node(nursery, "b")
            await b.connect(a)
            accepted = a.transport.statistics().accepted
            # Many connections at once, some closed abruptly (RST) right after the garbage.
            async with trio.open_nursery() as spew:
                for i in range(20):
                    spew.start_soon(send_raw, a.port, garbage, i % 2 == 0)

            def garbage_handled() -> bool | NotYet:
                stats = a.transport.statistics()
                return (stats.accepted == accepted + 20 and connections_settled(a)) or NotYet(stats)

            # a has taken and closed every garbage connection: whatever they did to it is done.
            await wait_until(garbage_handled, timeout=5.0, what="the garbage connections closed")
            assert a.router.peers == {"b"}  # the existing link is untouched
            c = await start_node(nursery, "c")
            assert await c.connect(a) == "a"  # and new links still come up
            with b.router.subscribe(Topic.STREAM) as inbox:
                await a.router.send(NodeId("b"), Topic.STREAM, GOOD)
                assert (await inbox.receive()).payload == GOOD
            nursery.cancel_scope.cancel()


async def send_raw(port: int, data: bytes, reset: bool) -> None:
    import socket
    import struct

    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await stream.send_all(data)
        if not reset:
            with trio.move_on_after(1):
                while await stream.receive_some(4096):
                    pass
    except trio.BrokenResourceError:
        pass
    finally:
        if reset:  # SO_LINGER 0: close with a RST, not a FIN
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await stream.aclose()


def test_envelope_json_shape() -> None:
    text = encode_envelope(Envelope(Topic.STREAM, NodeId("a"), GOOD))
    assert json.loads(text) == {
        "topic": "stream",
        "sender": "a",
        "payload": json.loads(wire.to_json(GOOD, wire.stream.StreamItem)),
    }
