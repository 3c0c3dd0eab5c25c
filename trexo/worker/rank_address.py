"""Where this node's rank of a split instance listens: the address its peers reach it on.

The host is the local end of this node's link to another rank's node (the transport knows
it: that peer reached us there, or we reached it from there), never a guess from the
interfaces. The port is one the kernel hands out for that host, free when chosen; a port
taken again before the runner binds it fails the bring-up, and the rebuilt group picks anew.
"""

from __future__ import annotations

import socket

from trexo.net.router import Router
from trexo.types.ids import NodeId
from trexo.types.state import Instance


def group_peers(instance: Instance, me: NodeId) -> list[NodeId]:
    """The other ranks' nodes, lead first: the link to any of them tells our address."""
    ordered = sorted(instance.assignments, key=lambda a: a.shard.rank)
    return [a.node_id for a in ordered if a.node_id != me]


def advertised_host(router: Router, instance: Instance) -> str | None:
    """This node's IP as another rank's node reaches it; else as any peer does (a link to
    the other ranks may still be forming); None while linked to no one."""
    others = sorted(router.peers)
    for peer in [*group_peers(instance, router.node_id), *others]:
        host = router.local_host(peer)
        if host is not None:
            return host
    return None


def free_port(host: str) -> int:
    """A TCP port free on `host` right now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
    return port


def rank_address(host: str, port: int) -> str:
    """`"ip:port"` as MLX's ring hostfile wants it (IPv6 in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
