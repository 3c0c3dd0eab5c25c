"""Where a rank of a split instance listens: its node's address as its peers reach it."""

from __future__ import annotations

import socket

from trexo.net.router import Envelope, Router
from trexo.types.ids import InstanceId, NodeId, RunnerId
from trexo.types.models import ModelRef
from trexo.types.shard import ShardSpec
from trexo.types.state import Instance, RunnerAssignment
from trexo.worker.rank_address import advertised_host, free_port, group_peers, rank_address

A, B, C = NodeId("a"), NodeId("b"), NodeId("c")
SPLIT = Instance(
    InstanceId("i"),
    ModelRef("m", "demo:tiny", 1),
    tuple(
        RunnerAssignment(RunnerId(f"r{rank}"), node, ShardSpec(rank, rank + 1, rank, 3))
        for rank, node in ((2, C), (0, A), (1, B))
    ),
)


class LinkFrom:
    def __init__(self, local_host: str | None) -> None:
        self.local_host = local_host

    async def send_envelope(self, envelope: Envelope) -> None:
        pass


def test_the_other_ranks_nodes_come_lead_first() -> None:
    assert group_peers(SPLIT, B) == [A, C]
    assert group_peers(SPLIT, A) == [B, C]


def test_the_host_is_the_local_end_of_a_link_to_another_rank() -> None:
    router = Router(C)
    assert advertised_host(router, SPLIT) is None  # linked to no one: no guess
    router.attach_link(NodeId("master"), LinkFrom("172.16.0.3"))
    assert advertised_host(router, SPLIT) == "172.16.0.3"  # until a rank's link is up
    router.attach_link(B, LinkFrom("10.0.0.3"))
    assert advertised_host(router, SPLIT) == "10.0.0.3"
    router.attach_link(A, LinkFrom("192.168.1.3"))
    assert advertised_host(router, SPLIT) == "192.168.1.3"  # the lead's link first


def test_a_free_port_can_be_bound_and_addresses_bracket_ipv6() -> None:
    port = free_port("127.0.0.1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
    assert rank_address("127.0.0.1", port) == f"127.0.0.1:{port}"
    assert rank_address("fe80::1", 5000) == "[fe80::1]:5000"
