"""Discovery on loopback: static peers (with re-dial), gossip to a full mesh, multicast."""

from __future__ import annotations

import logging
import socket
import struct

import attrs
import pytest
import trio

from tests.waiting import NotYet, wait_until
from trexo.config import DiscoveryConfig
from trexo.errors import WireError
from trexo.net import multicast
from trexo.net.beacon import MAX_BEACON_BYTES, Beacon, decode_beacon, encode_beacon
from trexo.types.ids import NodeId

from .helpers import (
    NO_MULTICAST,
    TEST_TIMEOUT_S,
    free_udp_port,
    logged,
    messages,
    start_node,
    wait_peers,
)

DISCOVERY_LOG = "trexo.net.discovery"


def static(*ports: int) -> DiscoveryConfig:
    return attrs.evolve(NO_MULTICAST, static_peers=tuple(("127.0.0.1", p) for p in ports))


async def failed_dials(caplog: pytest.LogCaptureFixture, port: int, count: int) -> None:
    """Until discovery has failed to reach the static peer at `port` `count` more times (its
    retries are logged at DEBUG after the first: capture that level)."""
    retry = f"static peer 127.0.0.1:{port}: "

    def failures() -> int:
        return sum(line.startswith(retry) and "retrying in" in line for line in messages(caplog))

    target = failures() + count
    await wait_until(
        lambda: failures() >= target or NotYet(failures()),
        timeout=5.0,
        what=f"{count} failed dials of 127.0.0.1:{port}",
    )


async def test_star_of_static_peers_becomes_a_full_mesh() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a")
            b = await start_node(nursery, "b", discovery=static(a.port))
            c = await start_node(nursery, "c", discovery=static(a.port))
            d = await start_node(nursery, "d", discovery=static(b.port))
            names = {"a", "b", "c", "d"}
            for node in (a, b, c, d):
                await wait_peers(node.router, names - {node.name})
            nursery.cancel_scope.cancel()


async def test_static_peer_is_redialled_after_it_comes_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=DISCOVERY_LOG)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            b = await start_node(nursery, "b")
            port = b.port
            a = await start_node(nursery, "a", discovery=static(port))
            await wait_peers(a.router, ["b"])
            await b.stop()
            await wait_peers(a.router, [], timeout=2.0)
            await failed_dials(caplog, port, 3)  # re-dials refused meanwhile; backoff at its cap
            b2 = await start_node(nursery, "b", port=port)  # the same node, restarted
            # Backoff is capped at redial_max (0.2 s in tests): back well within a second.
            await wait_peers(a.router, ["b"], timeout=2.0)
            await wait_peers(b2.router, ["a"])
            nursery.cancel_scope.cancel()


async def test_static_peer_that_starts_late_is_dialled(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=DISCOVERY_LOG)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
            port = listener.socket.getsockname()[1]
            await listener.aclose()  # a port nobody listens on (yet)
            a = await start_node(nursery, "a", discovery=static(port))
            await failed_dials(caplog, port, 2)  # the dial, and a retry, found nobody there
            await start_node(nursery, "b", port=port)
            await wait_peers(a.router, ["b"], timeout=2.0)
            nursery.cancel_scope.cancel()


async def test_static_peer_pointing_at_itself_is_given_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="trexo.net")
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a")
            # A second transport of the same node on another port, told to dial the first.
            again = await start_node(nursery, "a", discovery=static(a.port))

            def self_links() -> int:
                return sum("self-link" in line for line in messages(caplog))

            # Given up: discovery dials it no more, so the count of refusals is final.
            await wait_until(
                lambda: (
                    (logged(caplog, "is this node itself") and self_links() >= 2)
                    or NotYet(self_links())
                ),
                timeout=5.0,
                what="the static self-link given up",
            )
            assert self_links() == 2  # once a side
            assert a.router.peers == frozenset() and again.router.peers == frozenset()
            nursery.cancel_scope.cancel()


# --- multicast ---------------------------------------------------------------------------


def loopback_multicast_works(group: str, port: int) -> bool:
    """Whether a datagram to `group` on the loopback interface comes back here."""
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        receiver.bind(("", port))
        mreq = struct.pack("4s4s", socket.inet_aton(group), socket.inet_aton("127.0.0.1"))
        receiver.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
        sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 0)
        sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
        sender.sendto(b"probe", (group, port))
        receiver.settimeout(1.0)
        return receiver.recv(16) == b"probe"
    except OSError:
        return False
    finally:
        receiver.close()
        sender.close()


def loopback_beacons(port: int) -> DiscoveryConfig:
    """Beacons that stay on this host: TTL 0, out of and heard on the loopback interface."""
    return DiscoveryConfig(
        multicast=True,
        discovery_port=port,
        multicast_interface="127.0.0.1",
        multicast_ttl=0,
        beacon_interval=0.1,
    )


@pytest.fixture
def beacon_port() -> int:
    port = free_udp_port()
    if not loopback_multicast_works(DiscoveryConfig().multicast_group, port):
        pytest.skip("multicast on the loopback interface does not work on this machine")
    return port


async def beacons_heard(
    beacons: DiscoveryConfig,
    counts: dict[NodeId, int],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Count, by node, the beacons sent to the group (as every node's listener hears them)."""
    group = beacons.multicast_group
    with await multicast.open_listener(group, beacons.discovery_port, "127.0.0.1") as sock:
        task_status.started()
        while True:
            data, _ = await sock.recvfrom(MAX_BEACON_BYTES + 1)
            try:
                node_id = decode_beacon(data).node_id
            except WireError:
                continue  # not a beacon (the nodes ignore it too)
            counts[node_id] = counts.get(node_id, 0) + 1


async def test_nodes_find_each_other_by_multicast(
    beacon_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trexo.net")
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            beacons = loopback_beacons(beacon_port)
            heard: dict[NodeId, int] = {}
            await nursery.start(beacons_heard, beacons, heard)
            a = await start_node(nursery, "a", discovery=beacons)
            b = await start_node(nursery, "b", discovery=beacons)
            c = await start_node(nursery, "c", discovery=beacons)
            other = await start_node(nursery, "d", discovery=beacons, namespace="elsewhere")
            for node in (a, b, c):
                await wait_peers(node.router, {"a", "b", "c"} - {node.name})
            # Several beacons of the other namespace went by, to every node alike (one group).
            seen = heard.get(NodeId("d"), 0)
            await wait_until(
                lambda: heard.get(NodeId("d"), 0) >= seen + 3,
                timeout=5.0,
                what="3 more beacons of d",
            )
            assert other.router.peers == frozenset()
            assert "d" not in a.router.peers
            assert not logged(caplog, "refused")  # not even dialled: no handshake refused it
            nursery.cancel_scope.cancel()


async def test_stray_datagrams_on_the_discovery_port_are_ignored(
    beacon_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trexo.net.transport")
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            cfg = loopback_beacons(beacon_port)
            a = await start_node(nursery, "a", discovery=cfg)
            sender = multicast.open_sender(0, "127.0.0.1")
            with sender:
                for junk in (b"junk", b"{}", b"x" * 5000):
                    await multicast.send_beacon(sender, junk, cfg.multicast_group, beacon_port)
                # A beacon naming a node that does not exist: the dial fails, nothing else.
                ghost = Beacon("trexo", NodeId("zz-ghost"), 1, a.transport.config.protocol_version)
                await multicast.send_beacon(
                    sender, encode_beacon(ghost), cfg.multicast_group, beacon_port
                )
            # a heard the datagrams in order: past the ghost's, it has been through the junk.
            await wait_until(
                lambda: logged(caplog, "could not link to discovered peer zz-ghost"),
                timeout=5.0,
                what="the ghost's dial failed",
            )
            b = await start_node(nursery, "b", discovery=cfg)
            await wait_peers(a.router, ["b"])
            await wait_peers(b.router, ["a"])
            nursery.cancel_scope.cancel()


def test_beacons_only_go_to_a_multicast_group() -> None:
    with pytest.raises(ValueError, match="not an IPv4 multicast group"):
        multicast.check_group("192.0.2.255")
    with pytest.raises(ValueError, match="not an IPv4 multicast group"):
        multicast.check_group("255.255.255.255")
    multicast.check_group(DiscoveryConfig().multicast_group)
