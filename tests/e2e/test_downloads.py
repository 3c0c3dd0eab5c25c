"""Hugging Face models by name, through real `trexo run` processes and a fake hub on loopback."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
import trio

from tests.hub.fake_hub import FakeHub
from tests.hub.repos import TIED, UNTIED
from tests.waiting import NotYet, wait_answered, wait_until

from .cluster import Cluster, ClusterNode, open_cluster
from .harness import run_trexo

MESSAGES = [{"role": "user", "content": "What is a generator?"}]
MAX_TOKENS = 16
TIMEOUT_S = 90.0
"""Generous: catches hangs only."""
SLOW_RATE = 400_000
"""Bytes per second of the hub's link: the 3.5 MB model takes ~9 s, long enough to act
midway."""
CANCEL_BOUND_S = 5.0
"""Generous bound on a download process's end once nothing needs it (aim: within a second)."""
BLOCKS_0 = "model-blocks-0.safetensors"


def hub_env(hub: FakeHub, cache: Path) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache), "HF_TOKEN": ""}


def client(node: ClusterNode) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0)


async def chat(node: ClusterNode, model: str) -> str:
    reply = await client(node).chat.completions.create(
        model=model,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
    )
    assert reply.usage is not None and reply.usage.completion_tokens == MAX_TOKENS
    return reply.choices[0].message.content or ""


async def wait_serving(node: ClusterNode, model: str) -> str:
    """The first answer `node` gives a chat with `model` (until then, errors)."""
    return await wait_answered(
        lambda: chat(node, model),
        retry_on=openai.APIError,
        timeout=TIMEOUT_S,
        what=f"{model} served by {node.name}",
        poll=0.1,
    )


async def place(cluster: Cluster, via: ClusterNode, body: dict[str, Any]) -> str:
    response = await cluster.http.post(f"{via.url}/instances", json=body)
    assert response.status_code == 201, response.text
    instance_id: str = response.json()["instance_id"]
    return instance_id


async def state(cluster: Cluster, node: ClusterNode) -> dict[str, Any]:
    data: dict[str, Any] = (await cluster.http.get(f"{node.url}/state")).json()
    return data


async def download_of(cluster: Cluster, via: ClusterNode, node: ClusterNode, model: str) -> Any:
    return (await state(cluster, via))["downloads"].get(node.node_id, {}).get(model)


async def wait_download(
    cluster: Cluster, via: ClusterNode, node: ClusterNode, model: str, done: Any
) -> dict[str, Any]:
    """The download's progress in the state, once `done(progress)` holds."""

    async def reached() -> dict[str, Any] | NotYet:
        progress = await download_of(cluster, via, node, model)
        return progress if progress is not None and done(progress) else NotYet(progress)

    return await wait_until(
        reached, timeout=TIMEOUT_S, what=f"{node.name}'s download of {model} far enough"
    )


def download_pids(node: ClusterNode) -> list[int]:
    if node.process is None:
        return []
    try:
        children = psutil.Process(node.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p.pid for p in children if "trexo.hub.worker" in " ".join(p.cmdline())]


def exited(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def snapshot_weights(cache: Path, repo_id: str) -> set[str]:
    folder = cache / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    return {p.name for p in folder.glob("*/*.safetensors")}


async def test_a_hub_model_is_placed_by_name_downloaded_and_served(
    tmp_path: Path, hub: FakeHub
) -> None:
    cache = tmp_path / "hf-cache"
    async with open_cluster(tmp_path) as cluster:
        (node,) = [await cluster.add("--no-model", "-q", env=hub_env(hub, cache))]
        await cluster.wait_converged(expect_nodes=1)
        await place(cluster, node, {"model": TIED})
        text = await wait_serving(node, TIED)
        # The same weights as the built-in varied demo model: the same answer.
        await place(cluster, node, {"model": "trexo-demo-tiny-varied"})
        assert await wait_serving(node, "trexo-demo-tiny-varied") == text
        done = await download_of(cluster, node, node, TIED)
        assert done["phase"] == "done" and done["done_bytes"] == done["total_bytes"] > 0
        models = {m.id: m for m in (await client(node).models.list()).data}
        listed = models[TIED].model_dump()
        assert listed["downloaded"] and listed["ready"] and listed["n_layers"] == 4
        # Names the hub does not know, or will not give without a token, are refused clearly.
        response = await cluster.http.post(f"{node.url}/instances", json={"model": "x/nope"})
        assert response.status_code == 404
        assert "x/nope does not exist" in response.json()["error"]["message"]
        response = await cluster.http.post(
            f"{node.url}/instances", json={"model": "trexo-test/gated"}
        )
        assert response.status_code == 403
        error = response.json()["error"]
        assert error["code"] == "model_access_denied" and "HF_TOKEN" in error["message"]


async def test_each_rank_of_a_pipeline_downloads_only_its_files(
    tmp_path: Path, hub: FakeHub
) -> None:
    caches = [tmp_path / "cache-a", tmp_path / "cache-b"]
    async with open_cluster(tmp_path) as cluster:
        nodes = [await cluster.add("--no-model", "-q", env=hub_env(hub, c)) for c in caches]
        await cluster.wait_converged(expect_nodes=2)
        a, b = nodes
        body = {"model": UNTIED, "sharding": "pipeline", "node_ids": [a.node_id, b.node_id]}
        iid = await place(cluster, a, body)
        split = await wait_serving(b, UNTIED)
        assert snapshot_weights(caches[0], UNTIED) == {"model-embed.safetensors", BLOCKS_0}
        assert snapshot_weights(caches[1], UNTIED) == {
            "model-blocks-1.safetensors",
            "model-head.safetensors",
        }
        (await cluster.http.delete(f"{a.url}/instances/{iid}")).raise_for_status()
        await place(cluster, a, {"model": UNTIED, "node_ids": [a.node_id]})
        assert await wait_serving(a, UNTIED) == split  # token for token, whole or split
        assert len(snapshot_weights(caches[0], UNTIED)) == 4


async def test_progress_reaches_the_state_and_deleting_the_instance_ends_its_download(
    tmp_path: Path, hub: FakeHub
) -> None:
    hub.rate = SLOW_RATE
    async with open_cluster(tmp_path) as cluster:
        node = await cluster.add("--no-model", "-q", env=hub_env(hub, tmp_path / "cache"))
        await cluster.wait_converged(expect_nodes=1)
        iid = await place(cluster, node, {"model": TIED})
        midway = await wait_download(
            cluster, node, node, TIED, lambda p: 0 < p["done_bytes"] < p["total_bytes"]
        )
        assert midway["phase"] == "downloading"
        runner = next(iter((await state(cluster, node))["runners"].values()))
        assert runner["status"]["type"] == "RunnerDownloading"
        with pytest.raises(openai.APIStatusError) as refused:
            await chat(node, TIED)
        assert refused.value.status_code == 503
        assert "downloading the model (" in refused.value.message
        (pid,) = download_pids(node)
        (await cluster.http.delete(f"{node.url}/instances/{iid}")).raise_for_status()
        await wait_until(
            lambda: exited(pid), timeout=CANCEL_BOUND_S, what="the download process ended"
        )
        stopped = await wait_download(
            cluster, node, node, TIED, lambda p: p["phase"] != "downloading"
        )
        assert stopped["phase"] == "cancelled"
        assert stopped["done_bytes"] < stopped["total_bytes"]


async def test_a_node_killed_mid_download_resumes_where_it_stopped(
    tmp_path: Path, hub: FakeHub
) -> None:
    hub.rate = SLOW_RATE
    cache = tmp_path / "cache"
    async with open_cluster(tmp_path) as cluster:
        node = await cluster.add("--no-model", "-q", env=hub_env(hub, cache))
        await cluster.wait_converged(expect_nodes=1)
        await place(cluster, node, {"model": TIED})
        await wait_download(cluster, node, node, TIED, lambda p: p["done_bytes"] > 500_000)
        (worker,) = download_pids(node)
        assert node.process is not None
        os.kill(node.process.pid, signal.SIGKILL)
        await wait_until(  # its download process goes with it (EOF)
            lambda: exited(worker), timeout=CANCEL_BOUND_S, what="the download process ended"
        )
        # Files are fetched a few at a time: each one under way left its partial file.
        kept = {p.name.split(".")[0]: p.stat().st_size for p in cache.glob("*/blobs/*.incomplete")}
        assert kept and sum(kept.values()) > 0
        await cluster.stop(node)
        hub.rate = None
        await cluster.start(node)
        await cluster.wait_converged(expect_nodes=1)
        await place(cluster, node, {"model": TIED})
        await wait_serving(node, TIED)
    for file in hub.repos[TIED].files.values():
        if kept.get(file.etag, 0) > 0:  # asked for again from where it stopped, and right
            assert hub.ranges(TIED, file.name) == ["", f"bytes={kept[file.etag]}-"]
            (blob,) = cache.glob(f"*/blobs/{file.etag}")
            assert hashlib.sha256(blob.read_bytes()).hexdigest() == file.sha256


async def test_a_download_keeps_going_through_a_master_failover(
    tmp_path: Path, hub: FakeHub
) -> None:
    hub.rate = SLOW_RATE
    async with open_cluster(tmp_path) as cluster:
        master = await cluster.add(
            "--no-model", "-q", "--force-master", env=hub_env(hub, tmp_path / "a")
        )
        follower = await cluster.add("--no-model", "-q", env=hub_env(hub, tmp_path / "b"))
        await cluster.wait_converged(expect_nodes=2)
        await place(cluster, master, {"model": TIED, "node_ids": [follower.node_id]})
        await wait_download(
            cluster, follower, follower, TIED, lambda p: 0 < p["done_bytes"] < p["total_bytes"]
        )
        (worker,) = download_pids(follower)
        assert master.process is not None
        os.kill(master.process.pid, signal.SIGKILL)
        await wait_serving(follower, TIED)
        # The same download process ran on to the end (and waits for the next job): no
        # weight file was asked for twice (the master fetched only the config and index, to
        # resolve the name).
        assert download_pids(follower) == [worker]
        weights = [f for f in hub.downloads(TIED) if f.endswith(".safetensors")]
        assert sorted(weights) == sorted(set(weights)) and len(weights) == 3
        assert all(hub.ranges(TIED, f) == [""] for f in weights)
        done = await download_of(cluster, follower, follower, TIED)
        assert done["phase"] == "done"


async def test_download_command_then_an_offline_node_serves_from_disk(
    tmp_path: Path, hub: FakeHub
) -> None:
    cache = tmp_path / "cache"
    env = {**os.environ, **hub_env(hub, cache)}
    with trio.fail_after(TIMEOUT_S):
        done = await trio.run_process(
            [sys.executable, "-m", "trexo", "download", TIED, "--data-dir", str(tmp_path / "d")],
            env=env,
            capture_stdout=True,
            capture_stderr=True,
        )
    snapshot = Path(done.stdout.decode().strip())
    assert (snapshot / "config.json").is_file() and len(snapshot_weights(cache, TIED)) == 3
    asked = len(hub.requests)
    offline_env = {**hub_env(hub, cache), "HF_HUB_OFFLINE": "1"}
    async with run_trexo(tmp_path / "node", "--model", TIED, "-q", env=offline_env) as node:
        reply = await openai.AsyncOpenAI(
            base_url=f"{node.url}/v1", api_key="x", max_retries=0
        ).chat.completions.create(model=TIED, messages=MESSAGES, max_tokens=MAX_TOKENS)  # type: ignore[arg-type]
        assert reply.choices[0].message.content
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            missing = await http.post(f"{node.url}/instances", json={"model": UNTIED})
        assert missing.status_code == 404
        assert "offline" in missing.json()["error"]["message"]
    assert len(hub.requests) == asked  # offline: not one request to the hub
