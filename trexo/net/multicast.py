"""UDP sockets for discovery beacons, set up so that they only ever reach the group.

The sender addresses nothing but the configured multicast group (checked here), with a
small TTL (1: the local segment; 0: this host only) out of one interface. Listeners share
the discovery port (SO_REUSEADDR/SO_REUSEPORT), so several nodes on one host all hear it.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

import trio


def check_group(group: str) -> None:
    """Refuse anything but an IPv4 multicast address: beacons must never go elsewhere."""
    if not ipaddress.IPv4Address(group).is_multicast:
        raise ValueError(f"{group} is not an IPv4 multicast group")


def open_sender(ttl: int, interface: str) -> trio.socket.SocketType:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
        # Other nodes on this host hear us too.
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(interface))
    except BaseException:
        sock.close()
        raise
    return sock


async def open_listener(group: str, port: int, interface: str) -> trio.socket.SocketType:
    check_group(group)
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        await sock.bind(("", port))
        membership = struct.pack("4s4s", socket.inet_aton(group), socket.inet_aton(interface))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
    except BaseException:
        sock.close()
        raise
    return sock


async def send_beacon(sock: trio.socket.SocketType, data: bytes, group: str, port: int) -> None:
    check_group(group)
    await sock.sendto(data, (group, port))
