"""In-process nodes (Router + Transport [+ Discovery]) on 127.0.0.1, and test peers."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
from trio_websocket import WebSocketConnection, open_websocket
from wire_relay import serve_loopback

from tests.waiting import NotYet
from trexo.config import DiscoveryConfig, TransportConfig
from trexo.net import handshake as hs
from trexo.net.discovery import Discovery
from trexo.net.gossip import PeerInfo
from trexo.net.handshake_io import dial_handshake
from trexo.net.router import Router
from trexo.net.secure_channel import SecureChannel
from trexo.net.transport import RESOURCE, Transport
from trexo.types.ids import NodeId

TEST_TIMEOUT_S = 10.0
"""Every test's overall bound."""

FAST = TransportConfig(
    host="127.0.0.1",
    port=0,
    heartbeat_interval=0.1,
    suspect_after=0.3,
    lost_after=0.6,
    vouched_lost_after=1.5,
    handshake_timeout=2.0,
    send_timeout=1.0,
    close_timeout=0.1,
)
"""Short timeouts, loopback only."""

NO_MULTICAST = DiscoveryConfig(multicast=False, redial_initial=0.05, redial_max=0.2)


@attrs.define
class Node:
    name: NodeId
    router: Router
    transport: Transport
    port: int
    scope: trio.CancelScope
    stopped: trio.Event

    async def stop(self) -> None:
        """Cancel the node's services and wait until they have returned."""
        self.scope.cancel()
        with trio.fail_after(5):
            await self.stopped.wait()

    async def connect(self, other: Node) -> NodeId:
        return await self.transport.connect("127.0.0.1", other.port)


async def start_node(
    nursery: trio.Nursery,
    name: str,
    *,
    config: TransportConfig = FAST,
    discovery: DiscoveryConfig | None = None,
    router: Router | None = None,
    **overrides: Any,
) -> Node:
    """Start a node's transport (and discovery) in `nursery`; stop it with `Node.stop`."""
    node_id = NodeId(name)
    router = router or Router(node_id)
    transport = Transport(router, attrs.evolve(config, **overrides))
    scope = trio.CancelScope()
    stopped = trio.Event()

    async def run(*, task_status: trio.TaskStatus[int]) -> None:
        try:
            with scope:
                async with trio.open_nursery() as inner:
                    port = await inner.start(transport.run)
                    if discovery is not None:
                        await inner.start(Discovery(transport, discovery).run)
                    task_status.started(port)
        finally:
            stopped.set()

    port = await nursery.start(run)
    return Node(node_id, router, transport, port, scope, stopped)


async def wait_peers(router: Router, expected: Iterable[str], timeout: float = 5.0) -> None:
    """Until `router`'s linked peers are exactly `expected`."""
    want = frozenset(NodeId(n) for n in expected)
    peers = router.peers
    with trio.fail_after(timeout):
        while peers != want:
            peers = await router.wait_peers_change(peers)


def connections_settled(*nodes: Node) -> bool | NotYet:
    """Whether each node's only open connections are its links' (any duplicate, refused dial
    or stray connection has closed): a check for `wait_until`."""
    stats = {node.name: node.transport.statistics() for node in nodes}
    if all(s.connections == s.links for s in stats.values()):
        return True
    return NotYet(stats)


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def logged(caplog: pytest.LogCaptureFixture, *fragments: str) -> bool:
    """Whether one log line contains every fragment."""
    return any(all(f in line for f in fragments) for line in messages(caplog))


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class SealedPeer:
    """The test's end of a link: sends anything, sealed as a real peer seals it; `ws` is the
    raw websocket (to send what no peer would seal)."""

    def __init__(self, ws: WebSocketConnection, channel: SecureChannel) -> None:
        self.ws = ws
        self.channel = channel

    async def send_message(self, message: str | bytes) -> None:
        data = message.encode() if isinstance(message, str) else message
        await self.ws.send_message(self.channel.sealer.seal(data))

    async def get_message(self) -> bytes:
        sealed = await self.ws.get_message()
        assert isinstance(sealed, bytes), sealed
        return self.channel.opener.open(sealed)

    async def ping(self) -> None:
        await self.ws.ping()


@asynccontextmanager
async def fake_peer(
    target: Node,
    name: str = "fake",
    *,
    namespace: str = "trexo",
    secret: bytes | None = None,
    port: int = 1,
) -> AsyncIterator[SealedPeer]:
    """A peer under the test's control: dials `target`, does the real handshake, and
    hands over its end of the link (to send it anything)."""
    me = hs.Identity(
        NodeId(name), namespace, target.transport.config.protocol_version, port, secret
    )
    async with open_websocket("127.0.0.1", target.port, RESOURCE, use_ssl=False) as ws:
        agreed = await dial_handshake(ws, me, ())
        yield SealedPeer(ws, agreed.channel)


def peer_info(node: Node) -> PeerInfo:
    return PeerInfo(node.name, "127.0.0.1", node.port)


class FreezableProxy:
    """A TCP relay in front of a node whose `freeze()` stops all traffic while keeping the
    connections open: to the other side, the node looks SIGSTOPped. `reply_delay` holds
    back what the node sends by that long (a slow path one way)."""

    def __init__(self, target_port: int, *, reply_delay: float = 0.0) -> None:
        self.target_port = target_port
        self.reply_delay = reply_delay
        self.port = 0
        self._thawed = trio.Event()
        self._thawed.set()

    def freeze(self) -> None:
        self._thawed = trio.Event()

    def thaw(self) -> None:
        """Traffic flows again, what was held back first (a SIGCONT)."""
        self._thawed.set()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self.port = await nursery.start(serve_loopback, self._relay)
            task_status.started(self.port)

    async def _relay(self, client: trio.SocketStream) -> None:
        upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, client, upstream, nursery.cancel_scope, 0.0)
            nursery.start_soon(self._pump, upstream, client, nursery.cancel_scope, self.reply_delay)

    async def _pump(
        self,
        source: trio.SocketStream,
        sink: trio.SocketStream,
        scope: trio.CancelScope,
        delay: float,
    ) -> None:
        try:
            while data := await source.receive_some(65536):
                await self._thawed.wait()
                await trio.sleep(delay)
                await sink.send_all(data)
        except trio.BrokenResourceError:
            pass
        scope.cancel()


def quiet_websocket_logs() -> None:
    logging.getLogger("trio-websocket").setLevel(logging.WARNING)
