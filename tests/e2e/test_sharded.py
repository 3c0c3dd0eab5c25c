"""One model split across `trexo run` processes on loopback: serving, failure, rebuild."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import openai
import psutil
import trio

from tests.waiting import wait_answered, wait_until

from .cluster import Cluster, ClusterNode, open_cluster

MODEL = "trexo-demo-tiny-varied"
MESSAGES = [{"role": "user", "content": "What is a generator?"}]
MAX_TOKENS = 24
TIMEOUT_S = 90.0
"""Generous: catches hangs only; bench-sharding measures the real figures."""
TEARDOWN_BOUND_S = 15.0


def client(node: ClusterNode) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0)


async def chat(node: ClusterNode) -> tuple[str, int]:
    """A greedy chat through `node`'s API: its text and completion token count."""
    reply = await client(node).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0.0,  # type: ignore[arg-type]
    )
    assert reply.usage is not None
    return reply.choices[0].message.content or "", reply.usage.completion_tokens


async def streamed_text(
    node: ClusterNode, max_tokens: int, on_first: Callable[[], None] | None = None
) -> str:
    """A streamed chat's text; `on_first()` is called at its first content chunk."""
    text = ""
    stream = await client(node).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        stream=True,
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if not text and on_first is not None:
                on_first()
            text += chunk.choices[0].delta.content
    return text


async def place(cluster: Cluster, via: ClusterNode, body: dict[str, Any]) -> str:
    response = await cluster.http.post(f"{via.url}/instances", json={"model": MODEL, **body})
    assert response.status_code == 201, response.text
    instance_id: str = response.json()["instance_id"]
    return instance_id


async def state(cluster: Cluster, node: ClusterNode) -> dict[str, Any]:
    data: dict[str, Any] = (await cluster.http.get(f"{node.url}/state")).json()
    return data


async def wait_serving(node: ClusterNode) -> tuple[str, int]:
    """Until a chat through `node` is answered; that answer."""
    return await wait_answered(
        lambda: chat(node),
        retry_on=openai.APIError,
        timeout=TIMEOUT_S,
        what=f"a chat through {node.name}",
    )


async def delete_all(cluster: Cluster, via: ClusterNode) -> None:
    for iid in (await state(cluster, via))["instances"]:
        response = await cluster.http.delete(f"{via.url}/instances/{iid}")
        assert response.status_code == 200, response.text
    await wait_until(
        lambda: not any(n.process and n.process.runner_pids() for n in cluster.live()),
        timeout=TIMEOUT_S,
        what="every runner gone",
    )


async def reference(cluster: Cluster, node: ClusterNode) -> tuple[str, int]:
    """The whole model on one node: what every split must answer, token for token."""
    await place(cluster, node, {"node_ids": [node.node_id]})
    answer = await wait_serving(node)
    await delete_all(cluster, node)
    return answer


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def wait_exited(pids: list[int]) -> None:
    await wait_until(
        lambda: not [pid for pid in pids if alive(pid)],
        timeout=TEARDOWN_BOUND_S,
        what=f"runners {pids} exited",
    )


async def test_split_instances_answer_token_for_token_like_the_whole_model(
    tmp_path: Path,
) -> None:
    async with open_cluster(tmp_path) as cluster:
        nodes = await cluster.add_many(3, "--no-model", "-q")
        await cluster.wait_converged(expect_nodes=3)
        whole = await reference(cluster, nodes[0])
        assert whole[1] == MAX_TOKENS and len(set(whole[0].split())) > 5  # not one repeated token
        for body in (
            {"sharding": "pipeline", "node_ids": [n.node_id for n in nodes[:2]]},
            {"sharding": "pipeline", "nodes": 3},
            {"sharding": "tensor", "node_ids": [n.node_id for n in nodes[1:]]},
        ):
            await place(cluster, nodes[0], body)
            assert await wait_serving(nodes[0]) == whole, body
            for node in nodes[1:]:  # through every node's API
                assert await chat(node) == whole, body
            split = next(iter((await state(cluster, nodes[0]))["instances"].values()))
            assert len(split["assignments"]) == (3 if body.get("nodes") == 3 else 2)
            await delete_all(cluster, nodes[0])


@attrs.frozen
class TwoNodePipeline:
    a: ClusterNode
    b: ClusterNode
    whole: tuple[str, int]
    """What the whole model answers (and so the split one must)."""
    rank0: list[int]
    rank1: list[int]
    """Runner pids on A (rank 0) and on B (rank 1)."""


async def serving_two_node_pipeline(cluster: Cluster) -> TwoNodePipeline:
    """Nodes A and B, the model split over them (A is rank 0), answering as the whole does."""
    a, b = await cluster.add_many(2, "--no-model", "-q")
    await cluster.wait_converged(expect_nodes=2)
    whole = await reference(cluster, a)
    await place(cluster, a, {"sharding": "pipeline", "node_ids": [a.node_id, b.node_id]})
    assert await wait_serving(a) == whole
    assert a.process is not None and b.process is not None
    return TwoNodePipeline(a, b, whole, a.process.runner_pids(), b.process.runner_pids())


async def test_a_killed_rank_tears_the_instance_down_and_it_is_rebuilt(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        split = await serving_two_node_pipeline(cluster)
        a, whole, rank0, rank1 = split.a, split.whole, split.rank0, split.rank1
        assert a.process is not None
        epoch = next(iter((await state(cluster, a))["groups"].values()))["epoch"]

        failure: list[BaseException] = []
        streaming = trio.Event()

        async def long_stream() -> None:
            try:
                await streamed_text(a, 3000, on_first=streaming.set)
            except openai.APIError as exc:
                failure.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_stream)
            with trio.fail_after(TIMEOUT_S):
                await streaming.wait()
            os.kill(rank1[0], signal.SIGKILL)
            await wait_exited(rank0 + rank1)  # every rank, not only the killed one
        assert failure, "the in-flight stream ended without an error"
        # Rebuilt on new ports, new processes, serving the same tokens again.
        assert await wait_serving(a) == whole
        groups = (await state(cluster, a))["groups"]
        assert next(iter(groups.values()))["epoch"] > epoch
        assert not set(a.process.runner_pids()) & set(rank0)


async def test_a_frozen_rank_node_is_dropped_and_the_model_served_again(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        split = await serving_two_node_pipeline(cluster)
        a, b, whole, rank0, rank1 = split.a, split.b, split.whole, split.rank0, split.rank1
        assert b.process is not None
        os.kill(b.process.pid, signal.SIGSTOP)
        try:
            # B's node is gone from the cluster: its rank's instance is torn down on every
            # node (B's runner leaves by itself, its group broken), and the model is placed
            # again on the survivor.
            await wait_exited(rank0 + rank1)
            assert await wait_serving(a) == whole
        finally:
            os.kill(b.process.pid, signal.SIGCONT)


async def test_a_killed_rank_node_is_dropped_and_the_model_served_again(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        split = await serving_two_node_pipeline(cluster)
        assert split.b.process is not None
        os.kill(split.b.process.pid, signal.SIGKILL)
        await wait_exited(split.rank0 + split.rank1)
        assert await wait_serving(split.a) == split.whole


async def test_a_master_failover_keeps_a_split_instance_serving(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        master = await cluster.add("--no-model", "-q", "--force-master")
        a, b = await cluster.add_many(2, "--no-model", "-q")
        session = await cluster.wait_converged(expect_nodes=3)
        assert session["master_id"] == master.node_id
        await place(cluster, a, {"sharding": "pipeline", "node_ids": [a.node_id, b.node_id]})
        await wait_serving(a)
        assert a.process is not None and b.process is not None and master.process is not None
        pids = (a.process.runner_pids(), b.process.runner_pids())
        groups = (await state(cluster, a))["groups"]

        def kill_master() -> None:
            os.kill(master.process.pid, signal.SIGKILL)  # type: ignore[union-attr]

        undisturbed = await streamed_text(b, 200)
        with trio.fail_after(TIMEOUT_S):
            assert (
                await streamed_text(b, 200, on_first=kill_master) == undisturbed
            )  # the stream went on through the swap
        await cluster.wait_converged(expect_nodes=2, timeout=TIMEOUT_S)
        assert (a.process.runner_pids(), b.process.runner_pids()) == pids
        assert (await state(cluster, a))["groups"] == groups  # the same epoch, not rebuilt
        assert await wait_serving(a) == await chat(b)
