"""Several `trexo run` processes forming one cluster, always cleaned up: on loopback with
static peers, or each on a host of a lab (`tests/lab/netns.py`) finding the others by
multicast."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from tests.lab.netns import Host, Lab
from tests.waiting import NotYet, wait_until

from .harness import ISOLATED, TrexoProcess, run_trexo

CONVERGE_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 10.0
LAB_HTTP_TIMEOUT_S = 2.0
LAB_API_PORT = 52415
"""A lab host has a network of its own: every node takes the default ports there."""


def http_client(lab: Lab | None) -> httpx.AsyncClient:
    if lab is None:
        return httpx.AsyncClient(timeout=HTTP_TIMEOUT_S)
    # A fresh connection per request: a kept-alive one to a host since cut off would wait
    # out its timeout; and a cut-off host's health is unknown after a short wait.
    return httpx.AsyncClient(
        timeout=LAB_HTTP_TIMEOUT_S, limits=httpx.Limits(max_keepalive_connections=0)
    )


@attrs.define
class ClusterNode:
    name: str
    data_dir: Path
    peer_port: int
    """0 until its first start has bound one."""
    args: tuple[str, ...]
    env: dict[str, str]
    host: Host | None = None
    """The lab host the node runs on; None on loopback."""
    process: TrexoProcess | None = None
    stack: AsyncExitStack | None = None

    @property
    def url(self) -> str:
        assert self.process is not None
        return self.process.url

    @property
    def node_id(self) -> str:
        return (self.data_dir / "node_id").read_text().strip()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.process.returncode is None


@attrs.define
class Cluster:
    root: Path
    lab: Lab | None = None
    """Run node i on the lab's host i (default discovery) instead of on loopback."""
    nodes: list[ClusterNode] = attrs.field(factory=list)
    entry: Sequence[str] = ("-m", "trexo")
    """What python runs for each node (`run_trexo`'s `entry`): another tree's trexo, say."""
    http: httpx.AsyncClient = attrs.field(
        default=attrs.Factory(lambda self: http_client(self.lab), takes_self=True)
    )

    def seed_address(self) -> str:
        return f"127.0.0.1:{self.nodes[0].peer_port}"

    async def add(
        self, *extra: str, env: dict[str, str] | None = None, peers: bool = True
    ) -> ClusterNode:
        name = f"n{len(self.nodes)}"
        if self.lab is not None:
            host = self.lab.hosts[len(self.nodes)]
            node = ClusterNode(name, self.root / name, 0, extra, env or {}, host)
            self.nodes.append(node)
            await self.start(node)
            return node
        args = ["--peer-host", "127.0.0.1", "--no-multicast", *extra]
        if peers and self.nodes:
            args += ["--peer", self.seed_address()]
        node = ClusterNode(name, self.root / name, 0, tuple(args), env or {})
        self.nodes.append(node)
        await self.start(node)
        return node

    async def add_many(
        self, count: int, *extra: str, env: dict[str, str] | None = None
    ) -> list[ClusterNode]:
        return [await self.add(*extra, env=env) for _ in range(count)]

    async def start(self, node: ClusterNode) -> None:
        node.stack = AsyncExitStack()
        wrapper: list[str] = []
        isolation: tuple[str, ...] = ISOLATED
        if self.lab is not None and node.host is not None:
            wrapper = self.lab.exec_prefix(node.host)
            isolation = ("--api-host", node.host.address, "--api-port", str(LAB_API_PORT))
        # Port 0 the first time (the kernel's choice: no other test can take it between a
        # choice and the bind); a restart takes the same port again, which others know.
        port = ("--peer-port", str(node.peer_port)) if self.lab is None else ()
        node.process = await node.stack.enter_async_context(
            run_trexo(
                node.data_dir,
                *port,
                *node.args,
                env=node.env,
                wrapper=wrapper,
                isolation=isolation,
                entry=self.entry,
            )
        )
        if self.lab is None:
            node.peer_port = node.process.peer_port()

    async def stop(self, node: ClusterNode) -> None:
        if node.stack is not None:
            await node.stack.aclose()
            node.stack = None

    def live(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.alive]

    async def health(self, node: ClusterNode) -> dict[str, Any] | None:
        try:
            response = await self.http.get(f"{node.url}/health")
        except httpx.TransportError:
            return None
        data: dict[str, Any] = response.json()
        return data

    async def wait_converged(
        self,
        expect_nodes: int | None = None,
        timeout: float = CONVERGE_TIMEOUT_S,
        among: list[ClusterNode] | None = None,
    ) -> dict[str, Any]:
        """Until every live node (or every node of `among`) reports the same session, whole
        (opened by its master), with `expect_nodes` nodes (by default, as many as it asks)."""
        asked = among if among is not None else self.live()
        want = expect_nodes if expect_nodes is not None else len(asked)

        async def converged() -> dict[str, Any] | NotYet:
            healths = [await self.health(n) for n in asked]
            sessions = {repr(h["session"]) for h in healths if h is not None}
            if (
                all(h is not None and h["session_opened"] for h in healths)
                and len(sessions) == 1
                and all(h is not None and h["nodes"] == want for h in healths)
            ):
                session: dict[str, Any] = healths[0]["session"]  # type: ignore[index]
                return session
            return NotYet(healths)

        return await wait_until(
            converged, timeout=timeout, what=f"{len(asked)} nodes in one session of {want}"
        )

    def by_id(self, node_id: str) -> ClusterNode:
        for node in self.nodes:
            if node.alive and node.process is not None and node.node_id == node_id:
                return node
        raise LookupError(node_id)


@asynccontextmanager
async def open_cluster(
    root: Path, lab: Lab | None = None, entry: Sequence[str] = ("-m", "trexo")
) -> AsyncIterator[Cluster]:
    cluster = Cluster(root, lab, entry=entry)
    try:
        yield cluster
    finally:
        with trio.CancelScope(shield=True):
            for node in reversed(cluster.nodes):
                await cluster.stop(node)
            await cluster.http.aclose()
