"""The peer port under floods: unauthenticated handshakes are capped in all and per source
address (the surplus is closed at once, costing nothing), while established links keep
their heartbeats; and a gossiped peer list cannot make a node dial every address it names
at once (a dial storm, or a port scan by proxy)."""

from __future__ import annotations

import logging
import socket
import threading
from contextlib import AsyncExitStack
from functools import partial

import attrs
import pytest
import trio
from raw_websocket import OPCODE_TEXT, frame
from trio_websocket import ConnectionClosed, WebSocketRequest, open_websocket, serve_websocket
from wsproto import ConnectionType, WSConnection
from wsproto.events import Request

from tests.waiting import NotYet, holds_for, wait_until
from trexo import wire
from trexo.config import PROTOCOL_VERSION, TransportConfig
from trexo.errors import DialFailed
from trexo.net import handshake as hs
from trexo.net.admission import HandshakeAdmission
from trexo.net.codec import encode_peer_list
from trexo.net.dial_queue import DialQueue
from trexo.net.gossip import PeerInfo, PeerList, implausible_address
from trexo.net.handshake_io import dial_handshake
from trexo.net.secure_channel import EphemeralKey
from trexo.net.transport import RESOURCE
from trexo.types.ids import NodeId

from .helpers import FAST, TEST_TIMEOUT_S, fake_peer, logged, start_node

MAX_TOTAL, MAX_PER_ADDRESS = 24, 6
FLOOD = attrs.evolve(
    FAST, handshake_timeout=3.0, max_handshakes=MAX_TOTAL, max_handshakes_per_host=MAX_PER_ADDRESS
)
SOURCES = [f"127.0.0.{k}" for k in range(2, 7)]
"""Source addresses of the flood: all loopback, each its own peer address to the node."""
PER_SOURCE = 300
MESSAGE_TOO_BIG = 1009
"""The websocket close code for a message past the receiver's bound."""
PROMPT_S = 2.0
"""A refused connection is closed well before the 3 s handshake timeout would close it."""


def canned_hello(name: str) -> bytes:
    """A websocket upgrade and a hello, as one write: the flood costs its sender nothing."""
    upgrade = WSConnection(ConnectionType.CLIENT).send(Request(host="x", target=RESOURCE))
    me = hs.Identity(NodeId(name), "trexo", PROTOCOL_VERSION, 1, b"a guess")
    hello = wire.to_json(me.hello((), EphemeralKey()), hs.HandshakeMessage)
    return upgrade + frame(OPCODE_TEXT, hello)


@attrs.define
class Flood:
    """Threads that open connections to a port from several source addresses, send a hello
    on each and keep them open (a process of its own would do the same; threads keep the
    test in-process). `closed_early` counts those the node closed within `PROMPT_S`."""

    port: int
    sockets: list[socket.socket] = attrs.field(factory=list)
    closed_early: int = 0
    failed: list[str] = attrs.field(factory=list)
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def run(self, source: str) -> None:
        data = canned_hello(f"zz-{source}")
        for _ in range(PER_SOURCE):
            try:
                sock = socket.create_connection(
                    ("127.0.0.1", self.port), source_address=(source, 0)
                )
                sock.sendall(data)
            except OSError as exc:
                self.failed.append(str(exc))
                continue
            with self.lock:
                self.sockets.append(sock)

    def count_closed(self) -> int:
        """Connections the node has closed (EOF or reset) by now."""
        closed = 0
        for sock in self.sockets:
            sock.setblocking(False)
            try:
                while data := sock.recv(65536):
                    del data  # the node's answer to a hello we keep: read past it
                else:
                    closed += 1
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        return closed

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


async def test_a_handshake_flood_is_capped_and_established_links_keep_their_heartbeats(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="trexo.net")
    with trio.fail_after(TEST_TIMEOUT_S * 3):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a", config=FLOOD)
            b = await start_node(nursery, "b", config=FLOOD)
            await a.connect(b)
            peers = a.router.peers
            lost: list[frozenset[NodeId]] = []

            async def watch() -> None:
                while True:
                    lost.append(await a.router.wait_peers_change(peers))

            nursery.start_soon(watch)
            flood = Flood(a.port)
            try:
                async with trio.open_nursery() as flooding:
                    for source in SOURCES:
                        flooding.start_soon(trio.to_thread.run_sync, flood.run, source)
                total = len(flood.sockets)
                assert total >= len(SOURCES) * PER_SOURCE // 2, flood.failed[:3]
                # Beyond the caps, connections are closed at once: no upgrade, no key, no wait.
                surplus = total - MAX_TOTAL
                closed = await wait_until(
                    lambda: (n := flood.count_closed()) >= surplus or NotYet(n),
                    timeout=PROMPT_S,
                    what=f"{surplus} of {total} connections closed at once",
                )
                assert closed <= total
                stats = a.transport.statistics()
                assert stats.refused >= surplus, stats
                # The flood's handshakes time out; the link between a and b never missed a beat.
                await holds_for(
                    lambda: not lost,
                    seconds=FLOOD.handshake_timeout + 0.5,
                    what="the a-b link during the flood and its timeouts",
                )
            finally:
                flood.close()
            assert a.router.peers == {NodeId("b")}
            assert logged(caplog, "refusing peer connections")
            nursery.cancel_scope.cancel()


async def test_one_address_cannot_take_every_handshake_slot() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a", config=FLOOD)
            flood = Flood(a.port)
            try:
                await trio.to_thread.run_sync(flood.run, "127.0.0.2")
                await wait_until(
                    lambda: a.transport.statistics().refused >= PER_SOURCE - MAX_PER_ADDRESS,
                    timeout=PROMPT_S,
                    what="one address's surplus refused",
                )
                # A peer from another address still links at once.
                b = await start_node(nursery, "b", config=FLOOD, host="127.0.0.3")
                assert await b.transport.connect("127.0.0.1", a.port) == NodeId("a")
            finally:
                flood.close()
            nursery.cancel_scope.cancel()


def test_admission_caps_in_all_and_per_address_and_frees_a_slot_once() -> None:
    admission = HandshakeAdmission(max_total=3, max_per_host=2)
    first, second = admission.admit("h1"), admission.admit("h1")
    assert first is not None and second is not None
    assert admission.admit("h1") is None  # per address
    third = admission.admit("h2")
    assert third is not None
    assert admission.admit("h3") is None  # in all
    first.release()
    first.release()  # a second release frees nothing more
    assert admission.pending == 2
    assert admission.admit("h1") is not None
    assert admission.admit("h3") is None
    assert admission.refused == 3


# --- gossip ------------------------------------------------------------------------------


def test_the_dial_queue_lets_a_burst_out_then_a_rate_each_node_once() -> None:
    queue = DialQueue(capacity=5, rate=2.0, burst=2, now=0.0)
    targets = [PeerInfo(NodeId(f"z{k}"), "127.0.0.1", 1000 + k) for k in range(7)]
    assert [queue.offer(t) for t in targets] == [True] * 5 + [False] * 2
    assert queue.offer(targets[0]) and len(queue) == 5  # once per node
    assert [queue.pop(0.0), queue.pop(0.0), queue.pop(0.0)] == [targets[0], targets[1], None]
    assert queue.wait(0.0) == 0.5
    assert queue.pop(0.5) == targets[2]
    assert queue.pop(0.6) is None
    assert queue.dropped == 2


@pytest.mark.parametrize(
    ("host", "port"),
    [
        ("localhost", 52416),  # a name: gossip carries the addresses links came from
        ("example.org", 52416),
        ("0.0.0.0", 52416),
        ("::", 52416),
        ("224.0.0.1", 52416),  # multicast
        ("255.255.255.255", 52416),
        ("127.0.0.1", 0),
        ("127.0.0.1", 65536),
        ("127.0.0.1", -1),
        ("1.2.3.4\x00", 52416),
        ("x" * 10_000, 52416),
    ],
)
def test_implausible_gossiped_addresses_are_named(host: str, port: int) -> None:
    assert implausible_address(host, port) is not None


@pytest.mark.parametrize(("host", "port"), [("127.0.0.1", 52416), ("10.1.2.3", 1), ("::1", 9)])
def test_plausible_gossiped_addresses_pass(host: str, port: int) -> None:
    assert implausible_address(host, port) is None


class CountingListener:
    """A TCP port that counts the connections made to it (and closes each at once)."""

    def __init__(self) -> None:
        self.accepted = 0
        self.port = 0

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        await trio.serve_listeners(self._count, listeners, task_status=task_status)

    async def _count(self, stream: trio.SocketStream) -> None:
        self.accepted += 1
        await stream.aclose()


def gossip(port: int, count: int, host: str = "127.0.0.1") -> PeerList:
    # Ids greater than the node's own: it is the one to dial each of them.
    return PeerList(tuple(PeerInfo(NodeId(f"z{k:05d}"), host, port) for k in range(count)))


async def test_a_gossiped_list_does_not_make_a_node_dial_every_address_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="trexo.net")
    config = FAST
    with trio.fail_after(TEST_TIMEOUT_S * 2):
        async with trio.open_nursery() as nursery:
            target = CountingListener()
            await nursery.start(target.run)
            a = await start_node(nursery, "a", config=config)
            async with fake_peer(a, "b") as peer:
                sent_at = trio.current_time()
                await peer.send_message(encode_peer_list(NodeId("b"), gossip(target.port, 1000)))
                implausible = PeerList(
                    (
                        PeerInfo(NodeId("z9"), "localhost", target.port),
                        PeerInfo(NodeId("z8"), "127.0.0.1", 0),
                    )
                )
                await peer.send_message(encode_peer_list(NodeId("b"), implausible))
                await wait_until(
                    lambda: target.accepted > 0, timeout=5.0, what="the first gossiped dial"
                )
                window = 1.0
                await trio.sleep_until(sent_at + window)  # the rate is the behaviour under test
                bound = config.dial_burst + config.dial_rate * (trio.current_time() - sent_at + 0.5)
                assert target.accepted <= bound, (target.accepted, bound)
                # What it takes from one list is bounded too: the rest is never dialled.
                queued = a.transport.statistics().dial_queue
                assert target.accepted + queued <= config.gossip_dial_targets
            assert logged(caplog, "ignored", "gossiped", "localhost")
            nursery.cancel_scope.cancel()


# --- the size of what an unauthenticated side may send -----------------------------------


def huge_hello(name: str, peers: int = 12_000) -> str:
    """A hello that is valid but for its size (~1 MB): a peer list no honest node sends.
    Decoding one that size holds the event loop ~50 ms, 16 MB about a second."""
    listed = tuple(PeerInfo(NodeId(f"z{k:031d}"), "127.0.0.1", 52416) for k in range(peers))
    me = hs.Identity(NodeId(name), "trexo", PROTOCOL_VERSION, 1, None)
    return wire.to_json(me.hello(listed, EphemeralKey()), hs.HandshakeMessage).decode()


async def test_a_huge_hello_is_closed_unread_before_the_handshake() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a")
            async with open_websocket("127.0.0.1", a.port, RESOURCE, use_ssl=False) as ws:
                # Closed as too big, unread (decoding it would answer it with a hello).
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.send_message(huge_hello("zz-big"))
                    await ws.get_message()
            assert closed.value.reason.code == MESSAGE_TOO_BIG, closed.value.reason
            async with fake_peer(a, "b"):  # the port serves peers as before
                await wait_until(lambda: NodeId("b") in a.router.peers, timeout=5.0, what="b")
            nursery.cancel_scope.cancel()


async def test_a_dialled_address_that_answers_a_huge_hello_is_not_decoded() -> None:
    async def hostile_acceptor(request: WebSocketRequest) -> None:
        ws = await request.accept()
        await ws.get_message()  # the node's hello
        await ws.send_message(huge_hello("zz-acceptor"))
        await trio.sleep_forever()  # until the node closes the connection

    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                partial(serve_websocket, hostile_acceptor, "127.0.0.1", 0, ssl_context=None)
            )
            a = await start_node(nursery, "a")
            with pytest.raises(DialFailed, match=f"code {MESSAGE_TOO_BIG}"):
                await a.transport.connect("127.0.0.1", server.port)
            nursery.cancel_scope.cancel()


def test_an_honest_hello_fits_the_handshake_bound() -> None:
    # The most a node lists in its hello, with the longest ids and addresses peers use.
    config = TransportConfig()
    listed = tuple(
        PeerInfo(NodeId("f" * 32), "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255", 65535)
        for _ in range(config.gossip_dial_targets)
    )
    me = hs.Identity(NodeId("f" * 32), "a-long-namespace-name", PROTOCOL_VERSION, 65535, b"s")
    hello = me.hello(listed, EphemeralKey())
    hello = attrs.evolve(hello, proof="f" * 64)
    size = len(wire.to_json(hello, hs.HandshakeMessage))
    assert 2 * size <= config.handshake_message_bytes, size


async def test_a_node_lists_a_bounded_number_of_peers_in_its_hello() -> None:
    config = attrs.evolve(FAST, gossip_dial_targets=2)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
            a = await start_node(nursery, "a", config=config)
            for name in ("p1", "p2", "p3"):
                await stack.enter_async_context(fake_peer(a, name))
            async with open_websocket("127.0.0.1", a.port, RESOURCE, use_ssl=False) as ws:
                me = hs.Identity(NodeId("p4"), "trexo", PROTOCOL_VERSION, 1, None)
                agreed = await dial_handshake(ws, me, ())
                assert len(agreed.theirs.peers) == 2
                nursery.cancel_scope.cancel()
