"""Model downloads: trexo against huggingface_hub's own `snapshot_download`, and placement to the
first token of a model that is not on disk yet.

A fake Hugging Face hub on 127.0.0.1 (`tests/hub/fake_hub.py`, the endpoints and headers
huggingface_hub uses) serves the small demo model (20 M parameters, ~80 MB, one weights file).
Two link speeds: loopback as fast as it goes, and the hub sending each file at 100 MB/s (a
fast home connection; on a slower one the fixed costs weigh even less). Per trial, in turn,
into fresh caches:

- trexo: `resolve_model` (the hub's listing, the config and the index, as `POST /instances`
  does) and a `Downloads.fetch` of the whole model by a running node's service (its download
  process, the transfer, the size and sha256 checks, the snapshot links);
- huggingface_hub: `snapshot_download` of the same repo, in this process.

The first download of the run (trexo's starts its download process; both import
huggingface_hub) is reported apart and not counted.

The ratio is huggingface_hub's time over trexo's (1.0: as fast; the aim is ≥ 0.9).

Then a `trexo run --no-model` node with an empty cache: `POST /instances` of the repo to the
first content token of a streamed chat (polling as a client would), against the same model
already on disk (deleted and placed again); and, with the hub slowed to 5 MB/s so that a
download is under way, `DELETE /instances` to its download process's exit (a download no
instance needs is stopped). Run: `nox -s bench-download`.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import describe, markdown_table, markdown_value_table, summarize, write_results
from tests.e2e.cluster import ClusterNode, open_cluster
from tests.hub.fake_hub import FakeHub, serving
from trexo.config import HubConfig
from trexo.engine.demo_model import ensure_demo_model
from trexo.hub.downloads import Downloads
from trexo.hub.resolve import resolve_model
from trexo.types.ids import NodeId

REPO = "trexo-bench/demo-small"
CANCEL_RATE = 5e6
"""Bytes per second of the hub while a cancel is measured: the 80 MB take ~16 s."""
LINKS: dict[str, float | None] = {"loopback": None, "100 MB/s": 100e6}
MESSAGES = [{"role": "user", "content": "Hello"}]
TIMEOUT_S = 300.0


async def trexo_download(downloads: Downloads) -> float:
    """Resolve the repo and download the whole model, as a running node does."""
    started = time.perf_counter()
    model = await trio.to_thread.run_sync(resolve_model, REPO, downloads.config)
    await downloads.fetch(model)
    return time.perf_counter() - started


async def hf_download(hub: FakeHub, cache: Path) -> float:
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()
    started = time.perf_counter()
    await trio.to_thread.run_sync(
        lambda: snapshot_download(REPO, cache_dir=cache, endpoint=hub.url)
    )
    return time.perf_counter() - started


async def first_token(node: ClusterNode) -> None:
    """Until a streamed chat gives its first content token."""
    client = openai.AsyncOpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0)
    last_error = None
    try:
        while True:
            try:
                stream = await client.chat.completions.create(
                    model=REPO,
                    messages=MESSAGES,  # type: ignore[arg-type]
                    max_tokens=8,
                    stream=True,
                )
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        await stream.close()
                        return
                last_error = "a stream with no content"
            except openai.APIError as exc:
                last_error = str(exc)
            await trio.sleep(0.05)
    finally:
        if last_error is not None:
            print(f"  (last answer before the first token: {last_error})")


async def place_to_first_token(http: httpx.AsyncClient, node: ClusterNode) -> float:
    started = time.perf_counter()
    response = await http.post(f"{node.url}/instances", json={"model": REPO})
    response.raise_for_status()
    with trio.fail_after(TIMEOUT_S):
        await first_token(node)
    elapsed = time.perf_counter() - started
    (await http.delete(f"{node.url}/instances/{response.json()['instance_id']}")).raise_for_status()
    with trio.fail_after(TIMEOUT_S):
        while node.process is not None and node.process.runner_pids():
            await trio.sleep(0.05)
    return elapsed


def download_pids(node: ClusterNode) -> list[int]:
    assert node.process is not None
    children = psutil.Process(node.process.pid).children(recursive=True)
    return [p.pid for p in children if "trexo.hub.worker" in " ".join(p.cmdline())]


async def cancel_time(http: httpx.AsyncClient, node: ClusterNode) -> float:
    """From `DELETE /instances` of a model being downloaded to its download process's exit."""
    response = await http.post(f"{node.url}/instances", json={"model": REPO})
    response.raise_for_status()
    with trio.fail_after(TIMEOUT_S):
        while True:
            state = (await http.get(f"{node.url}/state")).json()
            progress = state["downloads"].get(node.node_id, {}).get(REPO)
            if progress and progress["phase"] == "downloading" and progress["done_bytes"] > 0:
                break
            await trio.sleep(0.05)
    (pid,) = download_pids(node)
    started = time.perf_counter()
    (await http.delete(f"{node.url}/instances/{response.json()['instance_id']}")).raise_for_status()
    with trio.fail_after(TIMEOUT_S):
        while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            await trio.sleep(0.002)
    return time.perf_counter() - started


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=args.data_dir) as tmp:
        root = Path(tmp)
        model_dir = ensure_demo_model(root / "models", "small")
        size = sum(p.stat().st_size for p in model_dir.iterdir())
        samples: dict[str, dict[str, list[float]]] = {
            link: {"trexo": [], "huggingface_hub": []} for link in LINKS
        }
        first: dict[str, float] = {}
        with serving() as hub:
            hub.add(REPO, model_dir)
            config = HubConfig(cache_dir=root / "cache-trexo", endpoint=hub.url, offline=False)
            async with trio.open_nursery() as nursery:
                service = Downloads(NodeId("bench"), config, log_dir=root / "logs")
                downloads = await nursery.start(service.run)
                for k in range(-1, args.trials):  # -1: the first downloads, not counted
                    for link, rate in LINKS.items():
                        hub.rate = rate
                        whos = ["trexo", "huggingface_hub"]
                        for who in whos if k % 2 == 0 else reversed(whos):
                            shutil.rmtree(root / f"cache-{who}", ignore_errors=True)
                            if who == "trexo":
                                took = await trexo_download(downloads)
                            else:
                                took = await hf_download(hub, root / f"cache-{who}")
                            if k < 0:
                                first.setdefault(who, took)
                            else:
                                samples[link][who].append(took)
                        if k >= 0:
                            line = ", ".join(f"{w} {v[-1]:.2f} s" for w, v in samples[link].items())
                            print(f"trial {k + 1}, {link}: {line}", flush=True)
                print(f"first download of the run (process start, imports): {first}")
                nursery.cancel_scope.cancel()
            hub.rate = None
            placement: dict[str, list[float]] = {"not on disk": [], "on disk": []}
            node_cache = root / "node-cache"
            env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(node_cache)}
            async with (
                open_cluster(root / "cluster") as cluster,
                httpx.AsyncClient(timeout=TIMEOUT_S) as http,
            ):
                node = await cluster.add("--no-model", "-q", env=env)
                await cluster.wait_converged(expect_nodes=1, timeout=TIMEOUT_S)
                for k in range(args.trials):
                    shutil.rmtree(node_cache, ignore_errors=True)
                    placement["not on disk"].append(await place_to_first_token(http, node))
                    placement["on disk"].append(await place_to_first_token(http, node))
                    print(
                        f"trial {k + 1}: place to first token "
                        f"{placement['not on disk'][-1]:.2f} s (download) / "
                        f"{placement['on disk'][-1]:.2f} s (on disk)",
                        flush=True,
                    )
                hub.rate = CANCEL_RATE
                cancels = []
                for k in range(args.trials):
                    shutil.rmtree(node_cache, ignore_errors=True)
                    cancels.append(await cancel_time(http, node))
                    print(
                        f"trial {k + 1}: download stopped {cancels[-1] * 1e3:.0f} ms after DELETE"
                    )
    report(samples, placement, cancels, first, size)


def report(
    samples: dict[str, dict[str, list[float]]],
    placement: dict[str, list[float]],
    cancels: list[float],
    first: dict[str, float],
    size: int,
) -> None:
    rows: dict[str, dict[str, float]] = {}
    values: dict[str, dict[str, Any]] = {}
    results: dict[str, Any] = {"model_bytes": size, "links": {}, "first_download_s": first}
    for link, by in samples.items():
        ratios = [h / t for h, t in zip(by["huggingface_hub"], by["trexo"], strict=True)]
        for who, times in by.items():
            rows[f"{link}: {who}"] = summarize(times)
            values[f"{link}: {who} MB/s"] = describe([size / t / 1e6 for t in times], "MB/s")
        values[f"{link}: huggingface_hub time / trexo time"] = describe(ratios, "", 2)
        results["links"][link] = {
            "trexo": summarize(by["trexo"]),
            "huggingface_hub": summarize(by["huggingface_hub"]),
            "ratio": describe(ratios, "", 2),
            "raw": by,
        }
    for name, times in placement.items():
        rows[f"POST /instances to first token, model {name}"] = summarize(times)
    rows["DELETE /instances to the download process's exit"] = summarize(cancels)
    results["cancel"] = summarize(cancels)
    results["placement"] = {name: summarize(t) for name, t in placement.items()}
    results["placement_raw"] = placement
    download_share = statistics.median(placement["not on disk"]) - statistics.median(
        placement["on disk"]
    )
    results["download_share_s"] = download_share
    path = write_results("download", results)
    print(markdown_table(rows))
    print(markdown_value_table(values))
    print(f"the download's share of placement to first token: {download_share:.2f} s")
    print(f"written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-k", "--trials", type=int, default=5)
    parser.add_argument("--data-dir", help="where caches and the node go (a temporary dir)")
    trio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
