"""A lab of hosts: Linux network namespaces joined by a bridge, each its own network stack
and address, with nothing connected to a real interface.

`lab(n)` creates, under names unique to this run, a bridge namespace, `n` host namespaces
(each with a veth into the bridge, an address in a private /24 the lab picks, loopback up
and a multicast route on its veth), and a veth from this (the test's) namespace into the
bridge, so the test reaches the hosts' APIs. Everything it created is deleted on exit,
whatever happened; a host's link can be cut and healed (`ip link set DEV down/up`).

A partition moves some hosts' bridge ports onto a second bridge in the same namespace: the
two sides cannot reach each other, each side still reaches its own. The test reaches the
far side through a second veth into that bridge (`.253`, with a host route per host on it).
"""

from __future__ import annotations

import fcntl
import os
import random
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import attrs

IP = "ip"
IP_TIMEOUT_S = 10.0
LAB_NET_FIRST_OCTETS = (10, 213)
"""The lab's /24s are 10.213.X.0/24 (X free on this machine): private, never routed here."""
LAB_LOCK = Path(tempfile.gettempdir()) / "trexo-lab.lock"
"""Held while a lab picks its subnet and claims it, so labs built at once (parallel test
workers) never share one."""
TEST_SIDE_HOST = 254
"""The test's own address in the lab: .254."""
TEST_FAR_SIDE_HOST = 253
"""The test's address on the far side of a partition."""
MULTICAST_ROUTE = "224.0.0.0/4"
HOST_DEV = "eth0"
BRIDGE_DEV = "br0"
FAR_BRIDGE_DEV = "br1"


class LabUnavailable(Exception):
    """This machine cannot build a lab (not root, no `ip`, no namespaces)."""


@attrs.frozen
class Host:
    namespace: str
    address: str
    index: int


@attrs.define
class Lab:
    prefix: str
    subnet: str
    """e.g. `10.213.57`: host i is `.{i+1}`, the test `.254`."""
    bridge_namespace: str
    hosts: tuple[Host, ...]
    partitioned: list[Host] = attrs.field(factory=list)
    """The hosts on the far side of the partition now in force (none: no partition)."""

    def cut(self, host: Host) -> None:
        """Pull the host's cable: its link goes down (both directions go silent)."""
        _ip("-n", host.namespace, "link", "set", HOST_DEV, "down")

    def heal(self, host: Host) -> None:
        """Plug it back in (its multicast route went with the link: it is put back)."""
        _ip("-n", host.namespace, "link", "set", HOST_DEV, "up")
        _ip("-n", host.namespace, "route", "replace", MULTICAST_ROUTE, "dev", HOST_DEV)

    def partition(self, far_side: list[Host]) -> None:
        """Split the lab in two: `far_side` and everyone else, each reaching only its own."""
        if self.partitioned:
            raise RuntimeError("the lab is partitioned already: end that partition first")
        for host in far_side:
            self._move_port(host, FAR_BRIDGE_DEV)
            self.partitioned.append(host)
            _ip("route", "replace", f"{host.address}/32", "dev", f"{self.prefix}u")

    def end_partition(self) -> None:
        """Join the two sides again."""
        while self.partitioned:
            host = self.partitioned.pop()
            _ip("route", "del", f"{host.address}/32", "dev", f"{self.prefix}u")
            self._move_port(host, BRIDGE_DEV)

    def _move_port(self, host: Host, bridge: str) -> None:
        _ip(
            "-n",
            self.bridge_namespace,
            "link",
            "set",
            f"{self.prefix}v{host.index}",
            "master",
            bridge,
        )

    def exec_prefix(self, host: Host) -> list[str]:
        """The command prefix that runs a program on `host`."""
        return [IP, "netns", "exec", host.namespace]


def available() -> str | None:
    """Why a lab cannot be built here, or None if it can."""
    if shutil.which(IP) is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"txprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except LabUnavailable as exc:
        return f"cannot create a network namespace: {exc}"
    _ip("netns", "del", probe)
    return None


@contextmanager
def lab(n: int) -> Iterator[Lab]:
    """`n` hosts on one bridge; all of it removed on exit."""
    tag = f"{os.getpid() % 10000}{random.randrange(1000):03d}"
    prefix = f"tx{tag}"
    bridge_ns = f"{prefix}br"
    made: list[str] = []
    test_devs = (f"{prefix}t", f"{prefix}u")
    try:
        with _lab_lock():
            subnet = _free_subnet()
            _ip("netns", "add", bridge_ns)
            made.append(bridge_ns)
            for bridge in (BRIDGE_DEV, FAR_BRIDGE_DEV):
                _ip("-n", bridge_ns, "link", "add", bridge, "type", "bridge")
                _ip("-n", bridge_ns, "link", "set", bridge, "up")
            hosts = []
            for i in range(n):
                host = Host(f"{prefix}h{i}", f"{subnet}.{i + 1}", i)
                _ip("netns", "add", host.namespace)
                made.append(host.namespace)
                _plug(host.namespace, HOST_DEV, f"{prefix}v{i}", bridge_ns, f"{host.address}/24")
                _ip("-n", host.namespace, "link", "set", "lo", "up")
                _ip("-n", host.namespace, "route", "add", MULTICAST_ROUTE, "dev", HOST_DEV)
                hosts.append(host)
            # The test's own side: a veth from this namespace into each bridge; the far one
            # has no subnet route (a partition adds a host route per far-side host).
            for dev, bridge, address in (
                (test_devs[0], BRIDGE_DEV, f"{subnet}.{TEST_SIDE_HOST}/24"),
                (test_devs[1], FAR_BRIDGE_DEV, f"{subnet}.{TEST_FAR_SIDE_HOST}/32"),
            ):
                _ip("link", "add", dev, "type", "veth", "peer", "name", f"{dev}b")
                _ip("link", "set", f"{dev}b", "netns", bridge_ns)
                _ip("-n", bridge_ns, "link", "set", f"{dev}b", "master", bridge, "up")
                _ip("addr", "add", address, "dev", dev)
                _ip("link", "set", dev, "up")
        yield Lab(prefix, subnet, bridge_ns, tuple(hosts))
    finally:
        for dev in test_devs:
            with suppress(LabUnavailable):
                _ip("link", "del", dev)
        for namespace in reversed(made):
            with suppress(LabUnavailable):
                _ip("netns", "del", namespace)  # its veth ends go with it


@contextmanager
def _lab_lock() -> Iterator[None]:
    with LAB_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _free_subnet() -> str:
    """A 10.213.X /24 that no lab on this machine holds now (the test side's addresses in
    this namespace say which are taken)."""
    listing = subprocess.run(
        [IP, "-o", "-4", "addr", "show"], check=True, capture_output=True, text=True
    ).stdout
    first = f"{LAB_NET_FIRST_OCTETS[0]}.{LAB_NET_FIRST_OCTETS[1]}"
    taken = set(re.findall(rf"inet {re.escape(first)}\.(\d+)\.", listing))
    free = [x for x in range(1, 250) if str(x) not in taken]
    if not free:
        raise LabUnavailable(f"every {first}.X/24 is taken by other labs")
    return f"{first}.{random.choice(free)}"


def _plug(namespace: str, dev: str, bridge_side: str, bridge_ns: str, cidr: str) -> None:
    """A veth pair: `dev` with `cidr` in `namespace`, `bridge_side` on the bridge."""
    _ip("-n", namespace, "link", "add", dev, "type", "veth", "peer", "name", bridge_side)
    _ip("-n", namespace, "link", "set", bridge_side, "netns", bridge_ns)
    _ip("-n", bridge_ns, "link", "set", bridge_side, "master", BRIDGE_DEV, "up")
    _ip("-n", namespace, "addr", "add", cidr, "dev", dev)
    _ip("-n", namespace, "link", "set", dev, "up")


def _ip(*args: str) -> None:
    try:
        subprocess.run(
            [IP, *args], check=True, capture_output=True, text=True, timeout=IP_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", None) or str(exc)
        raise LabUnavailable(f"ip {' '.join(args)}: {detail.strip()}") from None
