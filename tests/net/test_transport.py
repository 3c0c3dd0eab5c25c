"""Transports on loopback: linking, delivery, refusals, duplicates, losing peers."""

from __future__ import annotations

import logging

import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket

from tests.waiting import holds_for, wait_until
from trexo.errors import DialFailed, PeerRefused
from trexo.net import handshake as hs
from trexo.net.router import PeerUnreachable, Router
from trexo.net.topics import Topic
from trexo.net.transport import RESOURCE
from trexo.types.election import Campaign, Candidacy
from trexo.types.ids import NodeId, RequestId
from trexo.types.stream import CommandReply, StreamFailed

from .helpers import (
    FAST,
    TEST_TIMEOUT_S,
    FreezableProxy,
    Node,
    connections_settled,
    logged,
    start_node,
    wait_peers,
)

LOG = "trexo.net"


async def test_handshake_links_both_sides() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a")
            b = await start_node(nursery, "b")
            assert await b.connect(a) == "a"
            # The dialler's connect returns once its side is attached; the acceptor attached
            # before it said Ready.
            assert b.router.peers == {"a"}
            assert a.router.peers == {"b"}
            assert a.transport.links["b"].port == b.port  # the advertised port, not ephemeral
            nursery.cancel_scope.cancel()


async def test_connect_returns_existing_link() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a")
            b = await start_node(nursery, "b")
            await b.connect(a)
            history_a: list[frozenset[NodeId]] = []
            history_b: list[frozenset[NodeId]] = []
            await nursery.start(record_membership, a.router, history_a)
            await nursery.start(record_membership, b.router, history_b)
            assert await b.connect(a) == "a"
            assert await a.connect(b) == "b"
            # Each dial made a second connection; both ends keep one and close the other.
            await wait_until(
                lambda: connections_settled(a, b), timeout=5.0, what="the duplicates closed"
            )
            assert a.router.peers == {"b"} and b.router.peers == {"a"}
            assert history_a == [] and history_b == []  # a replaced link is no lost peer
            assert a.transport._links["b"].key == b.transport._links["a"].key
            nursery.cancel_scope.cancel()


async def test_publish_and_send_between_three_nodes() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a")
            b = await start_node(nursery, "b")
            c = await start_node(nursery, "c")
            await b.connect(a)
            await c.connect(a)
            for node, others in ((a, "bc"), (b, "ac"), (c, "ab")):
                await wait_peers(node.router, others)  # gossip closes the triangle

            with (
                a.router.subscribe(Topic.ELECTION) as a_in,
                b.router.subscribe(Topic.ELECTION) as b_in,
                c.router.subscribe(Topic.ELECTION) as c_in,
                b.router.subscribe(Topic.STREAM) as b_stream,
                c.router.subscribe(Topic.STREAM) as c_stream,
            ):
                campaign = Campaign(Candidacy(3, 1, 0, NodeId("c")))
                await c.router.publish(Topic.ELECTION, campaign)
                for inbox in (a_in, b_in, c_in):
                    envelope = await inbox.receive()
                    assert envelope.topic is Topic.ELECTION
                    assert envelope.sender == "c"
                    assert envelope.payload == campaign
                    assert type(envelope.payload) is Campaign

                failed = StreamFailed(RequestId("r1"), "boom")
                await a.router.send(NodeId("b"), Topic.STREAM, failed)
                got = await b_stream.receive()
                assert got.payload == failed and got.sender == "a"

                reply = CommandReply("cmd-1", result_id="i-1")
                await a.router.publish(Topic.STREAM, reply)
                for inbox in (b_stream, c_stream):
                    envelope = await inbox.receive()
                    assert type(envelope.payload) is CommandReply and envelope.payload == reply
                # Point-to-point: c saw nothing. Had the send reached c, it would have come
                # first, on the same in-order link from a as the broadcast.
                with pytest.raises(trio.WouldBlock):
                    c_stream.receive_nowait()
            nursery.cancel_scope.cancel()


async def test_send_to_unknown_node_raises() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a")
            with pytest.raises(PeerUnreachable):
                await a.router.send(
                    NodeId("nobody"), Topic.STREAM, StreamFailed(RequestId("r"), "x")
                )
            nursery.cancel_scope.cancel()


async def test_wrong_namespace_is_refused_with_reason_on_both_sides(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOG)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a", namespace="blue")
            b = await start_node(nursery, "b", namespace="red")
            with pytest.raises(PeerRefused) as refused:
                await b.connect(a)
            assert refused.value.code == hs.NAMESPACE
            assert refused.value.reason == "namespace 'red' != 'blue'"
            # a refused b (logged at a with b's address); b was told why (logged at b).
            assert logged(caplog, "refused peer 127.0.0.1:", "namespace 'red' != 'blue'")
            assert logged(caplog, f"peer 127.0.0.1:{a.port} refused the link", "'red' != 'blue'")
            assert a.router.peers == frozenset() and b.router.peers == frozenset()
            nursery.cancel_scope.cancel()


async def test_wrong_version_is_refused() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a")
            b = await start_node(nursery, "b", protocol_version=FAST.protocol_version + 1)
            with pytest.raises(PeerRefused) as refused:
                await b.connect(a)
            assert refused.value.code == hs.VERSION
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("secret_a", "secret_b", "fragment"),
    [
        (b"right", b"wrong", "cluster secret mismatch"),
        (b"right", None, "peer has no cluster secret"),
        (None, b"right", "peer requires a cluster secret"),
    ],
)
async def test_secret_mismatch_is_refused(
    caplog: pytest.LogCaptureFixture, secret_a: bytes | None, secret_b: bytes | None, fragment: str
) -> None:
    caplog.set_level(logging.WARNING, logger=LOG)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a", secret=secret_a)
            b = await start_node(nursery, "b", secret=secret_b)
            with pytest.raises(PeerRefused) as refused:
                await b.connect(a)
            assert refused.value.code == hs.AUTH
            assert fragment in refused.value.reason
            assert logged(caplog, "refused peer", fragment)
            assert logged(caplog, "refused the link", fragment)
            assert a.router.peers == frozenset() and b.router.peers == frozenset()
            for line in caplog.records:
                assert "right" not in line.getMessage() and "wrong" not in line.getMessage()
            nursery.cancel_scope.cancel()


async def test_right_secret_is_accepted() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a", secret=b"s3cret")
            b = await start_node(nursery, "b", secret=b"s3cret")
            assert await b.connect(a) == "a"
            assert a.router.peers == {"b"}
            nursery.cancel_scope.cancel()


async def test_self_link_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOG)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a")
            with pytest.raises(PeerRefused) as refused:
                await a.connect(a)
            assert refused.value.code == hs.SELF_LINK
            assert logged(caplog, "refused peer", "self-link")
            assert logged(caplog, "refused the link", "self-link")
            assert a.router.peers == frozenset()
            nursery.cancel_scope.cancel()


async def test_unreachable_peer_raises_dial_failed() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a")
            b = await start_node(nursery, "b")
            port = b.port
            await b.stop()
            with pytest.raises(DialFailed, match="cannot reach"):
                await a.transport.connect("127.0.0.1", port)
            nursery.cancel_scope.cancel()


async def test_silent_server_times_out_the_handshake() -> None:
    """A peer port that accepts TCP and then says nothing: connect fails in bounded time."""
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a", handshake_timeout=0.3)
            silent = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
            port = silent.socket.getsockname()[1]
            started = trio.current_time()
            with pytest.raises(DialFailed, match="no handshake"):
                await a.transport.connect("127.0.0.1", port)
            assert trio.current_time() - started < 1.0
            await silent.aclose()
            nursery.cancel_scope.cancel()


async def test_silent_client_is_closed_after_the_handshake_timeout() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a", handshake_timeout=0.3)
            async with await trio.open_tcp_stream("127.0.0.1", a.port) as stream:
                started = trio.current_time()
                with trio.fail_after(2):
                    while await stream.receive_some(1024):
                        pass  # (nothing comes) until the node closes the connection
                assert 0.25 < trio.current_time() - started < 1.5
            nursery.cancel_scope.cancel()


async def record_membership(
    router: Router,
    history: list[frozenset[NodeId]],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Append each new set of `router`'s peers to `history` (started: watching)."""
    peers = router.peers
    task_status.started()
    while True:
        peers = await router.wait_peers_change(peers)
        history.append(peers)


async def dial_each_other_at_once() -> None:
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, "a")
        b = await start_node(nursery, "b")
        history_a: list[frozenset[NodeId]] = []
        history_b: list[frozenset[NodeId]] = []
        await nursery.start(record_membership, a.router, history_a)
        await nursery.start(record_membership, b.router, history_b)
        results: dict[str, NodeId] = {}

        async def dial(x: Node, y: Node) -> None:
            results[x.name] = await x.connect(y)

        async with trio.open_nursery() as dials:
            dials.start_soon(dial, a, b)
            dials.start_soon(dial, b, a)
        assert results == {"a": "b", "b": "a"}
        await wait_until(
            lambda: connections_settled(a, b), timeout=5.0, what="the duplicate closed"
        )
        # Exactly one link each way, and neither side ever saw the peer go.
        assert history_a == [{"b"}] and history_b == [{"a"}]
        assert a.transport._links["b"].key == b.transport._links["a"].key
        assert a.transport._links["b"].key.dialer == "a"  # the smaller id's dial
        nursery.cancel_scope.cancel()


async def test_simultaneous_dial_keeps_exactly_one_link(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="trexo.net.transport")
    with trio.fail_after(TEST_TIMEOUT_S):
        for _ in range(5):  # the race goes differently each time
            await dial_each_other_at_once()
    assert logged(caplog, "keeping <Link"), "no duplicate was ever made: no race tested"


async def test_duplicate_closed_by_the_peer_first_is_no_peer_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The peer closes the losing connection before this side has the winner ready: this
    side waits for the winner instead of reporting the peer lost."""
    caplog.set_level(logging.DEBUG, logger="trexo.net.transport")
    slow_heartbeat = {"heartbeat_interval": 1.0, "suspect_after": 2.0, "lost_after": 3.0}
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a", **slow_heartbeat)
            b = await start_node(nursery, "b", **slow_heartbeat)
            history: list[frozenset[NodeId]] = []
            await nursery.start(record_membership, a.router, history)
            await b.connect(a)  # the link b dialled: the one to lose
            await wait_peers(a.router, "b")
            # a dials b on a slow path: b adopts a's dial (smaller id) and closes its own at
            # once; a hears that close 0.2 s before b's Ready.
            proxy = FreezableProxy(b.port, reply_delay=0.2)
            assert await a.transport.connect("127.0.0.1", await nursery.start(proxy.run)) == "b"
            await wait_until(lambda: connections_settled(a, b), timeout=5.0, what="b's link closed")
            assert logged(caplog, "closed <Link to b", "as a duplicate; awaiting the kept one")
            assert history == [{"b"}]  # never lost
            assert a.transport._links["b"].key == b.transport._links["a"].key
            assert a.transport._links["b"].key.dialer == "a"
            nursery.cancel_scope.cancel()


async def test_cancelled_peer_is_detached_quickly() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a")
            b = await start_node(nursery, "b")
            c = await start_node(nursery, "c")
            await b.connect(a)
            await c.connect(a)
            await wait_peers(a.router, "bc")
            await wait_peers(b.router, "ac")
            seen: dict[str, float] = {}

            async def watch(
                name: str, router: Router, *, task_status: trio.TaskStatus[None]
            ) -> None:
                peers = router.peers
                task_status.started()
                await router.wait_peers_change(peers)
                seen[name] = trio.current_time()

            with trio.fail_after(2.0):
                async with trio.open_nursery() as watchers:
                    await watchers.start(watch, "a", a.router)
                    await watchers.start(watch, "b", b.router)
                    died = trio.current_time()
                    c.scope.cancel()  # its sockets close as its tasks unwind
            assert a.router.peers == {"b"} and b.router.peers == {"a"}
            for name, when in seen.items():
                assert when - died < 2.0, name
            print(f"cancelled peer detached after {max(seen.values()) - died:.4f}s")
            nursery.cancel_scope.cancel()


async def test_heartbeat_detects_a_frozen_peer() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a")
            b = await start_node(nursery, "b")
            proxy = FreezableProxy(b.port)
            proxy_port = await nursery.start(proxy.run)
            assert await a.transport.connect("127.0.0.1", proxy_port) == "b"
            # Heartbeats flow through the proxy: the link holds. A link whose pings went
            # unanswered would be closed within frozen_peer_bound; it holds longer than that.
            await holds_for(
                lambda: a.router.peers == {"b"},
                seconds=FAST.frozen_peer_bound + FAST.heartbeat_interval,
                what="the link through the proxy",
            )
            proxy.freeze()
            frozen = trio.current_time()
            bound = FAST.frozen_peer_bound
            with trio.fail_after(bound + 0.5):
                await a.router.wait_peers_change(frozenset({NodeId("b")}))
            took = trio.current_time() - frozen
            print(f"frozen peer detected after {took:.3f}s (bound {bound:.2f}s)")
            assert a.router.peers == frozenset()
            await wait_peers(b.router, "", timeout=bound + 0.5)  # b noticed a as well
            nursery.cancel_scope.cancel()


def test_default_heartbeat_notices_a_frozen_peer_within_2_s() -> None:
    from trexo.config import TransportConfig

    assert TransportConfig().frozen_peer_bound <= 2.0


async def test_a_send_to_a_stuck_peer_is_bounded_and_closes_the_link(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            # Heartbeats are slow here, so only the send timeout can notice.
            slow_heartbeat = {"suspect_after": 30.0, "lost_after": 60.0, "vouched_lost_after": 90.0}
            a = await start_node(nursery, "a", send_timeout=0.3, **slow_heartbeat)
            b = await start_node(nursery, "b", **slow_heartbeat)
            proxy = FreezableProxy(b.port)
            await a.transport.connect("127.0.0.1", await nursery.start(proxy.run))
            proxy.freeze()  # b stops reading: the socket buffers fill, then sends block
            big = StreamFailed(RequestId("r"), "x" * 1_000_000)
            started = trio.current_time()
            while a.router.peers:
                await a.router.publish(Topic.STREAM, big)  # never raises, never hangs
            assert trio.current_time() - started < 5.0
            assert logged(caplog, "lost peer b", "a send blocked for 0.3s")
            nursery.cancel_scope.cancel()


async def test_websocket_client_without_a_hello_is_closed() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a", handshake_timeout=0.3)
            async with open_websocket("127.0.0.1", a.port, RESOURCE, use_ssl=False) as ws:
                started = trio.current_time()
                with pytest.raises(ConnectionClosed):
                    await ws.get_message()  # the node says nothing, then closes
                assert trio.current_time() - started < 1.5
            assert a.router.peers == frozenset()
            nursery.cancel_scope.cancel()
