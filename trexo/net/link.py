"""One live link to a peer: a handshaken websocket that carries envelopes both ways, each
sealed into one binary message by the link's `SecureChannel` (agreed by the handshake).

A `Link` is the router's `PeerLink`. Its `run` reads (and hands each envelope to the
router), pings the peer on a heartbeat, and returns when the link is over: the peer closed
it or died (the reader sees that at once), stayed silent too long (suspect first, while
other nodes are asked whether they hear it: `Transport`), sent too much garbage,
or `close()` was called (by a stuck send, or the transport replacing a duplicate).
Closing the websocket is separate (`aclose`), so that the transport can detach the link
from the router first: a lost peer is reported before any closing handshake is waited for.

The reader hands envelopes to the router in order and waits for it: a subscriber that stops
reading (after its buffer of `SUBSCRIBER_BUFFER`) stalls this link, then trio-websocket's
queue, and then its pong replies, so the link closes on heartbeats. Pings share the socket
with messages: a message must be sendable well within `suspect_after` (16 MiB is ~0.13 s
at 1 Gbit/s).

A message that does not open (tampered with, replayed, reordered, or not sealed at all) ends
the link at once, with `CLOSE_TAMPERED`: its counters can no longer agree with the peer's.
The peers link again as after any lost link. A message that opens but does not decode is
dropped, and counts as garbage. Websocket control frames (pings, pongs, the close frame) are
not sealed: they carry a ping counter and a close code and reason, nothing of the cluster's.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable

import attrs
import trio
from trio_websocket import ConnectionClosed, Endpoint, WebSocketConnection

from trexo.config import TransportConfig
from trexo.errors import SecureChannelError, WireError
from trexo.local_health import LocalHealth
from trexo.net.codec import decode_message, encode_envelope, encode_peer_list, encode_probe
from trexo.net.duplicates import LinkKey
from trexo.net.garbage import GarbageMeter
from trexo.net.gossip import PeerInfo, PeerList
from trexo.net.probe import Probe
from trexo.net.router import Envelope
from trexo.net.secure_channel import SecureChannel
from trexo.types.ids import NodeId

log = logging.getLogger(__name__)

# Websocket close codes (RFC 6455 §7.4; 4000-4999 are ours).
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
"""This node is stopping."""
CLOSE_POLICY = 1008
"""The peer sent too much garbage."""
CLOSE_SUPERSEDED = 4001
"""A duplicate connection between the same two nodes; the other one is kept."""
CLOSE_UNRESPONSIVE = 4002
"""The peer was silent too long, or a send to it blocked too long."""
CLOSE_REFUSED = 4003
"""The handshake refused the link; the refusal message said why."""
CLOSE_TAMPERED = 4004
"""A message failed to open (tampered with, replayed, reordered, unsealed)."""

MAX_CLOSE_REASON = 120
"""A close frame's reason must fit its 125-byte payload with the 2-byte code."""


@attrs.frozen
class LinkEnd:
    """Why a link's `run` returned."""

    reason: str
    superseded_by_peer: bool = False
    """The peer closed this link because it keeps another connection to us."""
    peer_heard_elsewhere: bool = False
    """The link went silent, but another node still heard the peer: it is alive (dial it
    again)."""


OnEnvelope = Callable[[Envelope], Awaitable[None]]
OnPeerList = Callable[["Link", PeerList], None]
OnProbe = Callable[["Link", Probe], None]


class Link:
    def __init__(
        self,
        ws: WebSocketConnection,
        channel: SecureChannel,
        *,
        local_id: NodeId,
        info: PeerInfo,
        key: LinkKey,
        address: str,
        config: TransportConfig,
        health: LocalHealth | None = None,
        on_suspect: Callable[[Link], None] = lambda link: None,
    ) -> None:
        """`health`: this node's (shared by its links); `on_suspect(link)`: the peer has been
        silent past `suspect_after` (the transport asks other nodes about it)."""
        self.info = info
        """The peer as gossip describes it: id, host as this connection sees it, peer port."""
        self.key = key
        self.address = address
        """The remote end of the connection, for log lines."""
        self._ws = ws
        self._channel = channel
        self._local_id = local_id
        self._config = config
        self._send_lock = trio.Lock()
        self._scope = trio.CancelScope()
        self._end: LinkEnd | None = None
        self._close_code = CLOSE_GOING_AWAY
        self._close_reason = "node stopping"
        self._garbage = GarbageMeter(config.garbage_limit, config.garbage_window)
        self._ping_ids = itertools.count()
        self._health = health or LocalHealth()
        self._on_suspect = on_suspect
        self._suspected = False
        self._vouched_at: float | None = None
        self.last_heard = trio.current_time()
        """When the peer was last heard: a message read, or a pong."""

    @property
    def peer_id(self) -> NodeId:
        return self.info.node_id

    @property
    def local_host(self) -> str | None:
        """This node's IP on this connection: an address the peer reaches us on."""
        local = self._ws.local
        return str(local.address) if isinstance(local, Endpoint) else None

    def __repr__(self) -> str:
        return f"<Link to {self.peer_id} at {self.address} dialled by {self.key.dialer}>"

    # --- sending (PeerLink) --------------------------------------------------------------

    async def send_envelope(self, envelope: Envelope) -> None:
        """Send one envelope; `trio.BrokenResourceError` if the link is (or goes) down."""
        await self._send(encode_envelope(envelope))

    async def send_peer_list(self, peers: PeerList) -> None:
        await self._send(encode_peer_list(self._local_id, peers))

    async def send_probe(self, probe: Probe) -> None:
        await self._send(encode_probe(self._local_id, probe))

    async def _send(self, text: str) -> None:
        # A checkpoint even when nothing is sent: a publisher looping over a closing link
        # must not starve the task that detaches it.
        await trio.lowlevel.checkpoint()
        limit = self._config.max_message_bytes
        if len(text) > limit:
            # The peer would drop it anyway; failing the publisher instead would let one
            # oversize message take a whole service down.
            log.error(
                "not sending a %d-byte message to %s: over the %d-byte limit",
                len(text),
                self.peer_id,
                limit,
            )
            return
        if self._end is not None:
            raise trio.ClosedResourceError(f"link to {self.peer_id} is closed")
        timeout = self._config.send_timeout
        deadline = trio.current_time() + timeout
        sent = False
        # The lock keeps senders whole-message apart, and seals messages in the order they go
        # out; the deadline covers waiting for it, so a peer that stopped reading cannot block
        # the router for longer than `send_timeout`.
        with trio.CancelScope(deadline=deadline):
            async with self._send_lock:
                if self._end is not None:
                    raise trio.ClosedResourceError(f"link to {self.peer_id} is closed")
                sealed = self._channel.sealer.seal(text.encode())
                # Once sealed, the message must go out (or the link end): a message sealed
                # and never sent would make every later one fail to open at the peer. So a
                # cancelled sender waits for it, within the same deadline.
                with trio.CancelScope(deadline=deadline, shield=True):
                    try:
                        await self._ws.send_message(sealed)
                    except ConnectionClosed:
                        raise trio.BrokenResourceError(f"link to {self.peer_id} closed") from None
                    sent = True
        if sent:
            return
        self.close(f"a send blocked for {timeout:g}s", CLOSE_UNRESPONSIVE)
        raise trio.BrokenResourceError(f"link to {self.peer_id} is stuck")

    # --- running ---------------------------------------------------------------------------

    def close(self, reason: str, code: int = CLOSE_NORMAL) -> None:
        """End the link (its `run` returns soon); the first reason given is the one kept."""
        if self._end is None:
            self._end = LinkEnd(reason)
            self._close_code, self._close_reason = code, reason
        self._scope.cancel()

    async def run(
        self, on_envelope: OnEnvelope, on_peer_list: OnPeerList, on_probe: OnProbe
    ) -> LinkEnd:
        """Carry messages until the link is over; says why it ended."""
        with self._scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._heartbeat)
                await self._read(on_envelope, on_peer_list, on_probe)
                nursery.cancel_scope.cancel()
        assert self._end is not None
        return self._end

    async def aclose(self) -> None:
        """Close the websocket with this link's close code (bounded, shielded: cleanup)."""
        reason = self._close_reason.encode()[:MAX_CLOSE_REASON].decode(errors="ignore")
        with trio.move_on_after(self._config.close_timeout, shield=True):
            await self._ws.aclose(self._close_code, reason)

    async def _read(
        self, on_envelope: OnEnvelope, on_peer_list: OnPeerList, on_probe: OnProbe
    ) -> None:
        opener = self._channel.opener
        while True:
            try:
                message = await self._ws.get_message()
            except ConnectionClosed as exc:
                self._peer_closed(exc)
                return
            self.heard()
            if isinstance(message, str):
                self._tampered(f"an unsealed text message ({len(message)} characters)")
                return
            try:
                # Every message is opened, even one too large to decode: each advances the
                # counter the next one is checked against.
                plaintext = opener.open(message)
            except SecureChannelError as exc:
                self._tampered(str(exc))
                return
            try:
                item = decode_message(
                    plaintext, sender=self.peer_id, max_bytes=self._config.max_message_bytes
                )
            except WireError as exc:
                log.warning(
                    "dropped a message from peer %s (%s): %s", self.peer_id, self.address, exc
                )
                if self._garbage.record(trio.current_time()):
                    cfg = self._config
                    reason = (
                        f"more than {cfg.garbage_limit} bad messages in {cfg.garbage_window:g}s"
                    )
                    log.warning(
                        "disconnecting peer %s (%s): %s", self.peer_id, self.address, reason
                    )
                    self.close(reason, CLOSE_POLICY)
                    return
                continue
            if isinstance(item, PeerList):
                on_peer_list(self, item)
            elif isinstance(item, Probe):
                on_probe(self, item)
            else:
                await on_envelope(item)

    def _tampered(self, problem: str) -> None:
        log.warning("closing the link to peer %s (%s): %s", self.peer_id, self.address, problem)
        self.close(f"a message failed to open: {problem}", CLOSE_TAMPERED)

    def _peer_closed(self, exc: ConnectionClosed) -> None:
        if self._end is not None:
            return
        close = exc.reason
        if close is None:
            self._end = LinkEnd("connection closed")
            return
        detail = f": {close.reason}" if close.reason else ""
        self._end = LinkEnd(
            f"connection closed (code {close.code}{detail})",
            superseded_by_peer=close.code == CLOSE_SUPERSEDED,
        )

    # --- failure detection -----------------------------------------------------------------

    def heard_ago(self, now: float) -> float:
        """Seconds since the peer was last heard (a message or a pong), this node's own stalls
        not counted: they are no silence of the peer's."""
        silence = now - self.last_heard
        return max(0.0, silence - self._health.stalled_since(self.last_heard))

    def vouch(self, now: float) -> None:
        """Another node heard the peer recently: it is alive, only this link is silent."""
        self._vouched_at = now

    async def _heartbeat(self) -> None:
        """Ping the peer every `heartbeat_interval` and judge its silence: suspect past
        `suspect_after` (others are asked whether they hear it), lost past `lost_after`
        (`vouched_lost_after` if another node heard it meanwhile), both stretched by this
        node's own local-health multiplier."""
        cfg = self._config
        async with trio.open_nursery() as pings:
            due = trio.current_time()
            while True:
                now = trio.current_time()
                self._health.observe(now, now - due)  # this task's own lateness
                pings.start_soon(self._ping_once)
                if self._judge(now):
                    return
                due = now + cfg.heartbeat_interval
                await trio.sleep_until(due)

    def _judge(self, now: float) -> bool:
        """Whether the link just closed for silence."""
        cfg = self._config
        silence = self.heard_ago(now)
        stretch = self._health.multiplier(now)
        if silence < cfg.suspect_after * stretch:
            self._suspected = False
            return False
        if not self._suspected:
            self._suspected = True
            log.info("peer %s is suspect: silent for %.2fs", self.peer_id, silence)
            self._on_suspect(self)
        vouched = self._vouched_at is not None and self._vouched_at >= self.last_heard
        limit = (cfg.vouched_lost_after if vouched else cfg.lost_after) * stretch
        if silence < limit:
            return False
        others = ", though another node heard it" if vouched else ", nor heard by others"
        reason = f"silent for {silence:.1f}s{others}"
        if self._end is None:
            self._end = LinkEnd(reason, peer_heard_elsewhere=vouched)
        self.close(reason, CLOSE_UNRESPONSIVE)
        return True

    async def _ping_once(self) -> None:
        payload = next(self._ping_ids).to_bytes(8, "big")  # unique: ping() refuses repeats
        with trio.move_on_after(self._config.vouched_lost_after):
            try:
                await self._ws.ping(payload)
            except ConnectionClosed:
                return  # the reader reports it
            self.heard()

    def heard(self) -> None:
        self.last_heard = trio.current_time()
