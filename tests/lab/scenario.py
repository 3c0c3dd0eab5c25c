"""What lab scenarios ask of a cluster: its instances, chats answered, processes gone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import psutil

from tests.e2e.cluster import Cluster, ClusterNode, open_cluster
from tests.waiting import wait_answered

from .netns import Lab, lab

MODEL = "trexo-demo-tiny"
OTHER_MODEL = "trexo-demo-tiny-varied"
MESSAGES = [{"role": "user", "content": "What is a generator?"}]
SERVE_TIMEOUT_S = 90.0
"""Generous: a runner's start and load take seconds on a loaded 2-core machine."""
RETRY_S = 0.1
"""Pause between chats while a model is not served yet (each failed one is a request)."""


@asynccontextmanager
async def lab_cluster(
    root: Path, hosts: int, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[Cluster, Lab]]:
    """A node with no model on each of `hosts` lab hosts, agreed on one master."""
    with lab(hosts) as the_lab:
        async with open_cluster(root, the_lab) as cluster:
            await cluster.add_many(hosts, "--no-model", env=env)
            await cluster.wait_converged(expect_nodes=hosts)
            yield cluster, the_lab


async def master_and_followers(
    cluster: Cluster,
) -> tuple[dict[str, Any], ClusterNode, list[ClusterNode]]:
    """The session every node agrees on, its master, and the other nodes."""
    session = await cluster.wait_converged()
    master = cluster.by_id(session["master_id"])
    return session, master, [n for n in cluster.nodes if n is not master]


async def state(cluster: Cluster, node: ClusterNode) -> dict[str, Any]:
    response = await cluster.http.get(f"{node.url}/state")
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


def instances_of(snapshot: dict[str, Any], model: str) -> dict[str, list[str]]:
    """Instance id -> the node ids holding it, for each instance of `model`."""
    return {
        iid: [a["node_id"] for a in instance["assignments"]]
        for iid, instance in snapshot["instances"].items()
        if instance["model"]["model_id"] == model
    }


async def place(
    cluster: Cluster, via: ClusterNode, model: str, nodes: list[ClusterNode], **body: Any
) -> str:
    response = await cluster.http.post(
        f"{via.url}/instances",
        json={"model": model, "node_ids": [n.node_id for n in nodes], **body},
    )
    assert response.status_code == 201, response.text
    instance_id: str = response.json()["instance_id"]
    return instance_id


async def chat(node: ClusterNode, model: str) -> str:
    client = openai.AsyncOpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0)
    reply = await client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=4,
        temperature=0.0,  # type: ignore[arg-type]
    )
    return reply.choices[0].message.content or ""


async def wait_serving(node: ClusterNode, model: str) -> str:
    """Until a chat with `model` through `node`'s API is answered; its text."""
    return await wait_answered(
        lambda: chat(node, model),
        retry_on=openai.APIError,
        timeout=SERVE_TIMEOUT_S,
        what=f"{model} served by {node.name}",
        poll=RETRY_S,
    )


def gone(pids: list[int]) -> bool:
    """None of `pids` is running any more (exited, or a zombie about to be reaped)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def ids(nodes: list[ClusterNode]) -> set[str]:
    return {n.node_id for n in nodes}
