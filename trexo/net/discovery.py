"""Discovery: finding peers to link to, by static address and by multicast beacon.

Static peers (`--peer HOST:PORT`) are dialled at start and re-dialled, with bounded
exponential backoff, whenever they are lost or cannot be reached. Beacons announce this
node to the multicast group every `beacon_interval`; a node that hears the beacon of a
node of its namespace dials it if its own id is the smaller (`Transport.dial_discovered`).
Gossip (in the transport) does the rest: every node learns of every other.
"""

from __future__ import annotations

import logging

import trio

from trexo.config import DiscoveryConfig
from trexo.errors import DialFailed, PeerRefused, WireError
from trexo.net import handshake as hs
from trexo.net import multicast
from trexo.net.beacon import MAX_BEACON_BYTES, Beacon, decode_beacon, encode_beacon, worth_dialling
from trexo.net.router import Router
from trexo.net.transport import Transport
from trexo.types.ids import NodeId

log = logging.getLogger(__name__)


class Discovery:
    def __init__(self, transport: Transport, config: DiscoveryConfig) -> None:
        self.transport = transport
        self.config = config

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Dial static peers and exchange beacons until cancelled. The transport must be
        running (its port goes into the beacons)."""
        cfg = self.config
        async with trio.open_nursery() as nursery:
            for host, port in cfg.static_peers:
                nursery.start_soon(self._keep_linked, host, port)
            if cfg.multicast:
                multicast.check_group(cfg.multicast_group)
                await self._start_beacons(nursery)
            task_status.started()

    async def _start_beacons(self, nursery: trio.Nursery) -> None:
        cfg = self.config
        try:
            listener = await multicast.open_listener(
                cfg.multicast_group, cfg.discovery_port, cfg.multicast_interface
            )
        except OSError as exc:
            # No multicast route (a container, no network yet): the node still works with
            # static peers and gossip, so this is a warning, not a crash.
            log.warning("discovery: cannot listen for beacons (%s); multicast is off", exc)
            return
        try:
            sender = multicast.open_sender(cfg.multicast_ttl, cfg.multicast_interface)
        except OSError as exc:
            listener.close()
            log.warning("discovery: cannot send beacons (%s); multicast is off", exc)
            return
        nursery.start_soon(self._listen, listener)
        nursery.start_soon(self._announce, sender)
        log.info("discovery: beacons on %s:%d", cfg.multicast_group, cfg.discovery_port)

    # --- static peers ------------------------------------------------------------------------

    async def _keep_linked(self, host: str, port: int) -> None:
        router = self.transport.router
        attempt = 0
        known: NodeId | None = None
        while True:
            if known is not None and known in router.peers:
                # It linked to us itself meanwhile: a dial would only make a duplicate.
                await _wait_unlinked(router, known)
            try:
                peer = known = await self.transport.connect(host, port)
            except PeerRefused as exc:
                if exc.code == hs.SELF_LINK:
                    log.info("static peer %s:%d is this node itself: not dialling it", host, port)
                    return
                attempt += 1
                delay = self.config.redial_delay(attempt)
                retry = "static peer %s:%d refused; retrying in %.1fs"
                self._log_retry(attempt, retry, host, port, delay)
            except DialFailed as exc:
                attempt += 1
                delay = self.config.redial_delay(attempt)
                retry = "static peer %s:%d: %s; retrying in %.1fs"
                self._log_retry(attempt, retry, host, port, exc, delay)
            else:
                await _wait_unlinked(router, peer)
                log.info("static peer %s at %s:%d lost; re-dialling", peer, host, port)
                # A pause even after a link that lived: a peer that drops every link at once
                # must not make us spin.
                attempt = 1
                delay = self.config.redial_delay(attempt)
            await trio.sleep(delay)

    @staticmethod
    def _log_retry(attempt: int, message: str, *args: object) -> None:
        # The first failure in a row is news; the backoff's later retries are not.
        log.log(logging.INFO if attempt == 1 else logging.DEBUG, message, *args)

    # --- multicast ---------------------------------------------------------------------------

    async def _announce(self, sock: trio.socket.SocketType) -> None:
        cfg = self.config
        tcfg = self.transport.config
        beacon = Beacon(
            tcfg.namespace, self.transport.node_id, self.transport.port, tcfg.protocol_version
        )
        data = encode_beacon(beacon)
        failing = False
        with sock:
            while True:
                try:
                    await multicast.send_beacon(sock, data, cfg.multicast_group, cfg.discovery_port)
                    failing = False
                except OSError as exc:
                    # A network that is down now may come up later: say so once, keep trying.
                    if not failing:
                        log.warning("discovery: cannot send a beacon: %s", exc)
                    failing = True
                await trio.sleep(cfg.beacon_interval)

    async def _listen(self, sock: trio.socket.SocketType) -> None:
        tcfg = self.transport.config
        with sock:
            while True:
                data, source = await sock.recvfrom(MAX_BEACON_BYTES + 1)
                try:
                    beacon = decode_beacon(data)
                except WireError as exc:
                    log.debug("discovery: ignored a datagram from %s: %s", source[0], exc)
                    continue
                if worth_dialling(
                    beacon,
                    node_id=self.transport.node_id,
                    namespace=tcfg.namespace,
                    version=tcfg.protocol_version,
                ):
                    self.transport.dial_discovered(source[0], beacon.port, beacon.node_id)


async def _wait_unlinked(router: Router, peer: NodeId) -> None:
    """Until `peer` is no longer linked (by any connection: it may have dialled us)."""
    peers = router.peers
    while peer in peers:
        peers = await router.wait_peers_change(peers)
