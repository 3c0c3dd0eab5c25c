"""Hosts in network namespaces of their own find each other by multicast beacons alone (no
`--peer`) and agree on one master; a master whose cable is pulled is replaced, and when it
is plugged back in there is one master again."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.e2e.harness import TrexoProcess, run_trexo

from .netns import Host, Lab, lab

API_PORT = 52415
CONVERGE_TIMEOUT_S = 60.0
POLL_S = 0.1
NO_KEEPALIVE = httpx.Limits(max_keepalive_connections=0)
REPLACE_BOUND_S = 5.0
HEAL_BOUND_S = 4.0


def host_args(host: Host) -> tuple[str, ...]:
    """A host's node: its API on its own address, its default peer port and multicast."""
    return ("--api-host", host.address, "--api-port", str(API_PORT), "--no-model")


@asynccontextmanager
async def nodes_on(
    the_lab: Lab, root: Path, hosts: Sequence[Host]
) -> AsyncIterator[list[TrexoProcess]]:
    async with AsyncExitStack() as stack:
        started = []
        for host in hosts:
            node = await stack.enter_async_context(
                run_trexo(
                    root / host.namespace,
                    wrapper=the_lab.exec_prefix(host),
                    isolation=host_args(host),
                )
            )
            started.append(node)
        yield started


async def healths(
    http: httpx.AsyncClient, nodes: Sequence[TrexoProcess]
) -> list[dict[str, Any] | None]:
    out: list[dict[str, Any] | None] = []
    for node in nodes:
        try:
            out.append((await http.get(f"{node.url}/health")).json())
        except httpx.TransportError:
            out.append(None)
    return out


async def wait_one_master(
    http: httpx.AsyncClient, nodes: Sequence[TrexoProcess], count: int
) -> dict[str, Any]:
    """Until every node reports the same session and sees `count` nodes."""
    with trio.fail_after(CONVERGE_TIMEOUT_S):
        while True:
            seen = await healths(http, nodes)
            sessions = {repr(h["session"]) for h in seen if h is not None}
            if (
                all(
                    h is not None and h["session"] is not None and h["nodes"] == count for h in seen
                )
                and len(sessions) == 1
            ):
                session: dict[str, Any] = seen[0]["session"]  # type: ignore[index]
                return session
            await trio.sleep(POLL_S)


async def test_three_hosts_find_each_other_by_multicast_and_agree_on_a_master(
    tmp_path: Path,
) -> None:
    with lab(3) as the_lab:
        async with (
            nodes_on(the_lab, tmp_path, the_lab.hosts) as nodes,
            httpx.AsyncClient(timeout=5.0) as http,
        ):
            session = await wait_one_master(http, nodes, 3)
            # Each node is on its own host's address, not loopback.
            assert {node.url for node in nodes} == {
                f"http://{host.address}:{API_PORT}" for host in the_lab.hosts
            }
            ids = {(node.data_dir / "node_id").read_text().strip() for node in nodes}
            assert session["master_id"] in ids


async def test_a_cut_off_master_is_replaced_and_after_the_heal_there_is_one_master(
    tmp_path: Path,
) -> None:
    with lab(3) as the_lab:
        async with (
            nodes_on(the_lab, tmp_path, the_lab.hosts) as nodes,
            # A fresh connection per poll: a kept-alive one to the cut host died with the cut.
            httpx.AsyncClient(timeout=1.0, limits=NO_KEEPALIVE) as http,
        ):
            first = await wait_one_master(http, nodes, 3)
            by_id = {(n.data_dir / "node_id").read_text().strip(): i for i, n in enumerate(nodes)}
            master_at = by_id[first["master_id"]]
            the_lab.cut(the_lab.hosts[master_at])
            others = [n for i, n in enumerate(nodes) if i != master_at]
            cut_at = trio.current_time()
            second = await wait_one_master(http, others, 2)
            replaced_s = trio.current_time() - cut_at
            assert second["master_id"] != first["master_id"]
            the_lab.heal(the_lab.hosts[master_at])
            healed_at = trio.current_time()
            third = await wait_one_master(http, nodes, 3)
            merged_s = trio.current_time() - healed_at
            print(f"replaced in {replaced_s:.2f} s, one master {merged_s:.2f} s after the heal")
            assert third["master_id"] in by_id
            # Generous bounds against hangs (measured: ~1.1 s and 0.2-1.2 s); a rejoined
            # node once waited for its next 5 s report to be listed again.
            assert replaced_s < REPLACE_BOUND_S
            assert merged_s < HEAL_BOUND_S
