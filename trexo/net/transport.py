"""The transport: this node's peer links over websockets, plugged under the router.

`Transport.run` listens on the peer port; `connect` dials. Every connection, either way,
goes through the handshake (`handshake_io`), which agrees the link's encryption, then
becomes a `Link` (every message sealed) that the router routes through, and lives as a
task of the transport's own nursery until it ends. On every change of the set of links the
transport gossips its peers to each of them, and dials the peers it hears of
(`gossip.should_dial`), so the links grow into a full mesh.

Two connections between the same two nodes (they dialled each other at once) are resolved
by `duplicates.keep_new`: both ends keep the same one and close the other with
`CLOSE_SUPERSEDED`. An end that sees the peer close a link that way waits (bounded) for the
kept connection to finish its handshake before it detaches anything, so the router never
reports the peer lost. Envelopes in flight on the closed duplicate may be lost: this only
happens while two nodes are first linking.

The peer port is open to anyone, so what reaches it before a handshake ends is bounded:
connections still handshaking are capped in all and per address (`admission`; the
surplus is closed at once, before any work), and the nodes that gossip and beacons name are
dialled at a bounded rate, a bounded number of them (`dial_queue`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import suppress
from functools import partial

import attrs
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    Endpoint,
    WebSocketConnection,
    wrap_client_stream,
    wrap_server_stream,
)
from wsproto.utilities import LocalProtocolError

from trexo.config import PEER_REFUSALS_LOG_INTERVAL_S, TransportConfig
from trexo.errors import DialFailed, LinkError, PeerRefused
from trexo.local_health import LocalHealth
from trexo.net import handshake as hs
from trexo.net.admission import HandshakeAdmission
from trexo.net.dial_queue import DialQueue
from trexo.net.duplicates import LinkKey, keep_new
from trexo.net.gossip import PeerInfo, PeerList, implausible_address, peer_lists, should_dial
from trexo.net.handshake_io import Agreement, accept_handshake, dial_handshake
from trexo.net.link import CLOSE_REFUSED, CLOSE_SUPERSEDED, MAX_CLOSE_REASON, Link, LinkEnd
from trexo.net.probe import PROBE_FANOUT, Probe
from trexo.net.router import Router
from trexo.net.secure_channel import SecureChannel
from trexo.safe_json import bounded, excerpt
from trexo.types.ids import NodeId

log = logging.getLogger(__name__)

RESOURCE = "/trexo"
"""The websocket path peers dial; an upgrade on any other path is refused."""
WRONG_PATH_STATUS = 404
WRONG_PATH_BODY = b"not a trexo peer endpoint\n"
READER_BREAKS = (ConnectionClosed, trio.BrokenResourceError, LocalProtocolError)
"""What trio-websocket's reader task may raise when a connection breaks under it: a reset
while it answers garbage, or a ping that arrives while we close (it then tries to pong in
state LOCAL_CLOSING: python-trio/trio-websocket#184). The connection is over either way."""


@attrs.frozen
class TransportStatistics:
    """A snapshot of a `Transport`, in the style of trio's `statistics()` objects."""

    links: int
    """Linked peers."""
    connections: int
    """Connections open, either way, links or not (yet): handshaking, a duplicate or a
    refused dial still closing. One per link once those have closed."""
    accepted: int
    """Connections accepted on the peer port since it opened (peers or not)."""
    refused: int = 0
    """Of those, connections closed at once: as many were handshaking as the caps allow."""
    dial_queue: int = 0
    """Nodes heard of (gossip, beacons) waiting for their dial."""


class Transport:
    def __init__(self, router: Router, config: TransportConfig) -> None:
        self.router = router
        self.config = config
        self._nursery: trio.Nursery | None = None
        self._port: int | None = None
        self._links: dict[NodeId, Link] = {}
        self._connections = 0
        self._accepted = 0
        self._dialing: set[NodeId] = set()
        """Nodes heard of that are queued for a dial or being dialled."""
        self._links_changed = trio.Event()
        self._gossip_due = trio.Event()
        self._admission = HandshakeAdmission(
            max_total=config.max_handshakes, max_per_host=config.max_handshakes_per_host
        )
        self._refusals_logged = (-math.inf, 0)  # when, and the refusal count then
        self._dials = DialQueue(
            capacity=config.gossip_dial_targets,
            rate=config.dial_rate,
            burst=config.dial_burst,
            now=0.0,
        )
        self._dial_queued = trio.Event()
        self._health = LocalHealth()
        """This node's own slowness, which its links discount from their peers' silence."""

    @property
    def node_id(self) -> NodeId:
        return self.router.node_id

    @property
    def port(self) -> int:
        """The bound peer port (known once `run` has started)."""
        if self._port is None:
            raise RuntimeError("the transport has not started")
        return self._port

    @property
    def links(self) -> dict[NodeId, PeerInfo]:
        """The linked peers, as gossip describes them."""
        return {peer: link.info for peer, link in self._links.items()}

    def statistics(self) -> TransportStatistics:
        return TransportStatistics(
            links=len(self._links),
            connections=self._connections,
            accepted=self._accepted,
            refused=self._admission.refused,
            dial_queue=len(self._dials),
        )

    # --- service -----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the peer port until cancelled; `task_status.started(bound_port)`."""
        cfg = self.config
        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(cfg.port, host=cfg.host)
            self._port = listeners[0].socket.getsockname()[1]
            serve = partial(
                trio.serve_listeners, self._on_connection, listeners, handler_nursery=nursery
            )
            await nursery.start(serve)
            nursery.start_soon(self._gossip_loop)
            nursery.start_soon(self._dial_loop, nursery)
            self._nursery = nursery
            log.info("node %s: peer port %s:%d", self.node_id, cfg.host, self._port)
            try:
                task_status.started(self._port)
                await trio.sleep_forever()
            finally:
                self._nursery = None

    async def connect(self, host: str, port: int) -> NodeId:
        """Dial a peer, handshake, and return its id once the link is attached.

        The link lives in the transport's nursery, not the caller's. `PeerRefused` if either
        side refused the link (the reason is logged on both), `DialFailed` if the peer could
        not be reached or the handshake did not finish within `handshake_timeout`. If a link
        to that peer exists already, returns its id (one link per pair of nodes).
        """
        peer: NodeId = await self._require_nursery().start(self._dial, host, port)
        return peer

    def dial_discovered(self, host: str, port: int, node_id: NodeId) -> bool:
        """Dial, in the background, a node heard of through gossip or a beacon, if this node
        should (`gossip.should_dial`: not linked, not being dialled, our id the smaller) and
        the address is plausible: it waits its turn in the dial queue (bounded in length and
        rate). Failures are logged. Returns whether the dial is queued."""
        if self._nursery is None or not should_dial(
            self.node_id, node_id, self._links, self._dialing
        ):
            return False
        if (why := implausible_address(host, port)) is not None:
            log.info("ignored a gossiped address of node %s: %s", bounded(node_id), why)
            return False
        if not self._dials.offer(PeerInfo(node_id, host, port)):
            return False
        self._dialing.add(node_id)
        self._dial_queued.set()
        return True

    def _require_nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise RuntimeError("the transport is not running")
        return self._nursery

    # --- dialling ---------------------------------------------------------------------------

    async def _dial_loop(self, nursery: trio.Nursery) -> None:
        """Start the queued dials, as fast as the dial queue's rate allows."""
        while True:
            while not self._dials:
                await self._dial_queued.wait()
                self._dial_queued = trio.Event()
            await trio.sleep(self._dials.wait(trio.current_time()))
            target = self._dials.pop(trio.current_time())
            if target is None:
                continue
            if target.node_id in self._links:
                self._dialing.discard(target.node_id)  # it dialled us meanwhile
                continue
            nursery.start_soon(
                self._dial_in_background, nursery, target.host, target.port, target.node_id
            )

    async def _dial_in_background(
        self, nursery: trio.Nursery, host: str, port: int, node_id: NodeId
    ) -> None:
        try:
            await nursery.start(self._dial, host, port)
        except DialFailed as exc:
            log.info("could not link to discovered peer %s at %s:%d: %s", node_id, host, port, exc)
        except PeerRefused:
            pass  # logged where it happened
        finally:
            self._dialing.discard(node_id)

    async def _dial(
        self,
        host: str,
        port: int,
        *,
        task_status: trio.TaskStatus[NodeId] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        address = bounded(f"{host}:{port}")  # from gossip or a beacon: a peer chose it
        failure: LinkError | None = None
        started = _StartedFlag(task_status)
        self._connections += 1
        try:
            # The websocket's reader runs in this nursery: the connection dies with this task.
            async with trio.open_nursery() as connection:
                try:
                    ws, agreed = await self._dial_handshake(connection, host, port)
                except LinkError as exc:
                    failure = exc
                else:
                    theirs = agreed.theirs
                    info = PeerInfo(theirs.node_id, _host(ws.remote, host), theirs.port)
                    key = LinkKey(self.node_id, agreed.ours.nonce)
                    link = self._link(ws, agreed.channel, info, key, address)
                    await self._serve(link, theirs.peers, started)
                connection.cancel_scope.cancel()
        except* ConnectionRejected as group:
            failure = DialFailed(f"{address} is not a trexo peer port: {group.exceptions[0]!r}")
        except* READER_BREAKS:
            # trio-websocket's reader saw the connection break; the link (if any) is gone.
            failure = DialFailed(f"connection to {address} broke")
        finally:
            self._connections -= 1
        if failure is not None and not started.done:
            self._log_refusal(address, failure)
            raise failure

    async def _dial_handshake(
        self, nursery: trio.Nursery, host: str, port: int
    ) -> tuple[WebSocketConnection, Agreement]:
        """TCP connect, websocket upgrade and handshake, within `handshake_timeout`.
        On failure or cancellation the connection is closed."""
        cfg = self.config
        stream: trio.SocketStream | None = None
        ws: WebSocketConnection | None = None
        try:
            with trio.fail_after(cfg.handshake_timeout):
                try:
                    stream = await trio.open_tcp_stream(host, port)
                except (OSError, ValueError, OverflowError) as exc:
                    # Addresses come from gossip and beacons, so from peers: a host name
                    # IDNA cannot encode is a UnicodeError, a port past 2**63 an OverflowError.
                    address = bounded(f"{host}:{port}")
                    raise DialFailed(f"cannot reach {address}: {exc}") from None
                ws = await wrap_client_stream(
                    nursery,
                    stream,
                    f"{host}:{port}",
                    RESOURCE,
                    message_queue_size=cfg.message_queue,
                    max_message_size=cfg.handshake_message_bytes,
                )
                agreed = await dial_handshake(ws, self._identity(), self._hello_peers())
                _take_link_messages(ws, cfg)
                return ws, agreed
        except BaseException as exc:
            reason = str(exc) if isinstance(exc, LinkError) else "handshake failed"
            await _abandon(ws, stream, cfg.close_timeout, reason=reason)
            if isinstance(exc, trio.TooSlowError):
                timeout = cfg.handshake_timeout
                raise DialFailed(f"no handshake with {host}:{port} within {timeout:g}s") from None
            raise

    # --- accepting ---------------------------------------------------------------------------

    async def _on_connection(self, stream: trio.SocketStream) -> None:
        """One task per incoming TCP connection (in our nursery); never raises but Cancelled."""
        host, address = _address(stream)
        self._accepted += 1
        slot = self._admission.admit(host)
        if slot is None:
            # Nothing read, nothing computed: the surplus of a flood costs an accept.
            with trio.CancelScope(shield=True):
                await stream.aclose()
            self._log_refusals(host)
            return
        self._connections += 1
        try:
            async with trio.open_nursery() as connection:
                await self._accept(connection, stream, address, slot.release)
                connection.cancel_scope.cancel()
        except* READER_BREAKS:
            # trio-websocket's reader saw the connection break (garbage, then a reset).
            log.debug("connection from %s broke", address)
        finally:
            slot.release()  # if the handshake did not get to it
            with trio.CancelScope(shield=True):
                await stream.aclose()
            self._connections -= 1

    def _log_refusals(self, host: str) -> None:
        """One line per `PEER_REFUSALS_LOG_INTERVAL_S` during a flood, not one per connection."""
        now = trio.current_time()
        logged_at, count = self._refusals_logged
        if now - logged_at < PEER_REFUSALS_LOG_INTERVAL_S:
            return
        admission = self._admission
        log.warning(
            "refusing peer connections (the last from %s): %d handshaking, at most %d in all "
            "and %d per address; %d refused since the last such line",
            host,
            admission.pending,
            admission.max_total,
            admission.max_per_host,
            admission.refused - count,
        )
        self._refusals_logged = (now, admission.refused)

    async def _accept(
        self,
        nursery: trio.Nursery,
        stream: trio.SocketStream,
        address: str,
        handshake_ended: Callable[[], None],
    ) -> None:
        cfg = self.config
        ws: WebSocketConnection | None = None
        try:
            # One deadline for the websocket upgrade and our handshake; raw garbage, or a
            # client that says nothing, is dropped when it passes.
            with trio.fail_after(cfg.handshake_timeout):
                request = await wrap_server_stream(
                    nursery,
                    stream,
                    message_queue_size=cfg.message_queue,
                    max_message_size=cfg.handshake_message_bytes,
                )
                if request.path != RESOURCE:
                    # Not a peer (a scanner, a browser, another service's client): no
                    # websocket for it, so nothing of ours ever reads what it sends.
                    log.info(
                        "refused a websocket upgrade from %s: path %s is not %s",
                        address,
                        excerpt(request.path),
                        RESOURCE,
                    )
                    await request.reject(WRONG_PATH_STATUS, body=WRONG_PATH_BODY)
                    return
                ws = await request.accept()
                agreed = await accept_handshake(ws, self._identity(), self._hello_peers())
                _take_link_messages(ws, cfg)
        except trio.TooSlowError:
            timeout = cfg.handshake_timeout
            log.info("closed connection from %s: no handshake within %gs", address, timeout)
            await _abandon(ws, stream, cfg.close_timeout)
            return
        except LinkError as exc:
            self._log_refusal(address, exc)
            await _abandon(ws, stream, cfg.close_timeout, reason=str(exc))
            return
        except ConnectionClosed:
            log.debug("connection from %s closed before the handshake", address)
            return
        finally:
            handshake_ended()
        theirs = agreed.theirs
        info = PeerInfo(theirs.node_id, _host(ws.remote, address), theirs.port)
        link = self._link(ws, agreed.channel, info, LinkKey(theirs.node_id, theirs.nonce), address)
        await self._serve(link, theirs.peers, _StartedFlag(trio.TASK_STATUS_IGNORED))

    # --- links -------------------------------------------------------------------------------

    def _link(
        self,
        ws: WebSocketConnection,
        channel: SecureChannel,
        info: PeerInfo,
        key: LinkKey,
        address: str,
    ) -> Link:
        return Link(
            ws,
            channel,
            local_id=self.node_id,
            info=info,
            key=key,
            address=address,
            config=self.config,
            health=self._health,
            on_suspect=self._on_suspect,
        )

    async def _serve(
        self, link: Link, their_peers: tuple[PeerInfo, ...], started: _StartedFlag
    ) -> None:
        """Attach a handshaken link, carry it until it ends, detach it, close it."""
        adopted = self._adopt(link)
        started.started(link.peer_id)
        if not adopted:
            link.close("duplicate connection; an existing link is kept", CLOSE_SUPERSEDED)
            await link.aclose()
            return
        self._heard_of(their_peers)
        end: LinkEnd | None = None
        try:
            end = await link.run(self.router.deliver, self._on_peer_list, self._on_probe)
            if end.superseded_by_peer:
                await self._wait_replaced(link)
            if self._links.get(link.peer_id) is link:
                log.info("lost peer %s (%s): %s", link.peer_id, link.address, end.reason)
        finally:
            self._release(link)
            await link.aclose()
        if end is not None and end.peer_heard_elsewhere:  # alive; only the connection is not
            self.dial_discovered(link.info.host, link.info.port, link.peer_id)

    def _adopt(self, link: Link) -> bool:
        existing = self._links.get(link.peer_id)
        if existing is not None:
            if not keep_new(existing.key, link.key):
                log.debug("closing %r: keeping %r", link, existing)
                return False
            log.debug("replacing %r with %r", existing, link)
            existing.close("duplicate connection; a newer link is kept", CLOSE_SUPERSEDED)
        else:
            log.info("linked to peer %s (%s)", link.peer_id, link.address)
        self._links[link.peer_id] = link
        self.router.attach_link(link.peer_id, link)
        self._changed()
        return True

    def _release(self, link: Link) -> None:
        if self._links.get(link.peer_id) is link:
            del self._links[link.peer_id]
            self.router.detach_link(link.peer_id, link)
            self._changed()

    async def _wait_replaced(self, link: Link) -> None:
        # The peer keeps another connection to us, whose handshake it has finished; ours
        # finishes within moments, unless it broke (then the peer is lost after all).
        if self._links.get(link.peer_id) is link:
            log.debug("peer %s closed %r as a duplicate; awaiting the kept one", link.peer_id, link)
        with trio.move_on_after(self.config.handshake_timeout):
            while self._links.get(link.peer_id) is link:
                await self._links_changed.wait()

    def _changed(self) -> None:
        self._links_changed.set()
        self._links_changed = trio.Event()
        self._gossip_due.set()

    # --- indirect probes ---------------------------------------------------------------------

    def _on_suspect(self, link: Link) -> None:
        """`link`'s peer has gone silent: ask a few other linked nodes whether they hear it."""
        others = [other for peer, other in self._links.items() if peer != link.peer_id]
        nursery = self._nursery
        if nursery is None:
            return
        for other in others[:PROBE_FANOUT]:
            nursery.start_soon(self._send_probe, other, Probe(link.peer_id, ask=True))

    def _on_probe(self, link: Link, probe: Probe) -> None:
        nursery = self._nursery
        subject = self._links.get(probe.about)
        if probe.ask:
            now = trio.current_time()
            heard = subject.heard_ago(now) if subject is not None else None
            if nursery is not None:
                answer = Probe(probe.about, ask=False, heard_ago=heard)
                nursery.start_soon(self._send_probe, link, answer)
            return
        if subject is None or probe.heard_ago is None:
            return
        if probe.heard_ago < self.config.suspect_after:
            log.info(
                "peer %s is alive: %s heard it %.2fs ago",
                probe.about,
                link.peer_id,
                probe.heard_ago,
            )
            subject.vouch(trio.current_time())

    @staticmethod
    async def _send_probe(link: Link, probe: Probe) -> None:
        with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await link.send_probe(probe)  # else the link is going; its end reports itself

    # --- gossip ------------------------------------------------------------------------------

    def _hello_peers(self) -> tuple[PeerInfo, ...]:
        """The peers a hello lists: as many as a receiver takes from one list, so that a
        hello always fits `handshake_message_bytes` (gossip tells the rest)."""
        infos = [link.info for link in self._links.values()]
        return tuple(infos[: self.config.gossip_dial_targets])

    def _on_peer_list(self, link: Link, peers: PeerList) -> None:
        self._heard_of(peers.peers)

    def _heard_of(self, peers: tuple[PeerInfo, ...]) -> None:
        taken = self.config.gossip_dial_targets
        if len(peers) > taken:
            log.warning(
                "ignored %d of %d gossiped peers: at most %d are taken from one list",
                len(peers) - taken,
                len(peers),
                taken,
            )
        for peer in peers[:taken]:
            self.dial_discovered(peer.host, peer.port, peer.node_id)

    async def _gossip_loop(self) -> None:
        while True:
            await self._gossip_due.wait()
            self._gossip_due = trio.Event()  # changes while we send make another round
            links = dict(self._links)
            lists = peer_lists({peer: link.info for peer, link in links.items()})
            async with trio.open_nursery() as nursery:
                for peer, peer_list in lists.items():
                    nursery.start_soon(self._send_gossip, links[peer], peer_list)

    @staticmethod
    async def _send_gossip(link: Link, peers: PeerList) -> None:
        with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await link.send_peer_list(peers)  # else the link is going; its end reports itself

    # --- helpers -----------------------------------------------------------------------------

    def _identity(self) -> hs.Identity:
        cfg = self.config
        return hs.Identity(self.node_id, cfg.namespace, cfg.protocol_version, self.port, cfg.secret)

    def _log_refusal(self, address: str, failure: LinkError | None) -> None:
        """Refusals are logged on both sides; other failures are the dialler's to report."""
        if isinstance(failure, PeerRefused):
            if failure.by_peer:
                log.warning("peer %s refused the link: %s", address, failure.reason)
            else:
                log.warning("refused peer %s: %s", address, failure.reason)
        else:
            log.debug("no link with %s: %s", address, failure)


class _StartedFlag:
    """A task status that remembers whether `started` was called."""

    def __init__(self, status: trio.TaskStatus[NodeId]) -> None:
        self._status = status
        self.done = False

    def started(self, peer: NodeId) -> None:
        self.done = True
        self._status.started(peer)


async def _abandon(
    ws: WebSocketConnection | None,
    stream: trio.SocketStream | None,
    grace: float,
    *,
    reason: str = "handshake failed",
) -> None:
    """Close a connection that never became a link (bounded, shielded: cleanup)."""
    if ws is not None:
        with trio.move_on_after(grace, shield=True):
            await ws.aclose(
                CLOSE_REFUSED, reason.encode()[:MAX_CLOSE_REASON].decode(errors="ignore")
            )
    if stream is not None:
        with trio.CancelScope(shield=True):
            await stream.aclose()


def _take_link_messages(ws: WebSocketConnection, config: TransportConfig) -> None:
    """Raise the connection's message bound from the handshake's to a link's, now that the
    peer has done its handshake. trio-websocket takes the bound when it wraps a stream and
    has no setter for it, so this sets the attribute that its reader checks."""
    ws._max_message_size = config.hard_message_bytes


def _address(stream: trio.SocketStream) -> tuple[str, str]:
    """The remote host of a connection, and its address for log lines."""
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "<disconnected>", "<disconnected>"
    return str(host), f"{host}:{port}"


def _host(endpoint: Endpoint | str, fallback: str) -> str:
    """The remote IP of a connection: where a neighbour can reach that peer."""
    if isinstance(endpoint, Endpoint):
        return str(endpoint.address)
    return fallback
