"""Soak: many short chats against one node, then three; does the master stay bounded?

Each configuration starts real `trexo run` processes on loopback: the master (with
`--force-master`, so it stays the master) holding the tiny demo model, and for three nodes
two followers without a model, so their chats travel to the master's runner and back.
`--concurrency` clients send chats (`max_tokens` 1) round-robin through every node's API
until `--requests` are served or `--max-seconds` pass. Recorded:

- the master process's RSS (runners excluded) against requests served, sampled every
  `--sample-every` seconds, with its `/health` history: events in memory, last snapshot
  index, log bytes, and the bytes under its events directory;
- catch-up: at `--joins` points spread over the run (the first before any load), the load
  pauses and a fresh node joins (`--no-model`). From its link to the cluster coming up (its
  trace's `peer_joined`): to its state view holding the session's state (`view_caught_up`:
  the snapshot and the events after it applied), and to the first chat answered through
  its own API (polled every 5 ms from its start), which also waits for what a fresh
  process does once: importing the tokenizer machinery (~1.1 s of CPU, begun at its start)
  and loading the model's tokenizer (for a demo model, building its files: ~0.2 s).

Run: `nox -s bench-soak` (add `-- --requests 20000` for a shorter run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import RESULTS_DIR, write_results
from tests.e2e.cluster import Cluster, ClusterNode, free_port, open_cluster

MODEL = "trexo-demo-tiny"
MIB = 1024 * 1024
JOIN_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 120.0


def chat_body(k: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Question number {k}: what is a loop?"}],
        "max_tokens": 1,
    }


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / MIB


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class Load:
    """Clients that send chats round-robin through `urls` while `running` is set."""

    def __init__(self, http: httpx.AsyncClient, urls: list[str], concurrency: int) -> None:
        self.http = http
        self.urls = urls
        self.concurrency = concurrency
        self.served = 0
        self.failed = 0
        self.errors: dict[str, int] = {}

    async def run_until(self, target: int, deadline: float) -> None:
        async def client(offset: int) -> None:
            k = offset
            while self.served < target and time.monotonic() < deadline:
                url = self.urls[k % len(self.urls)]
                k += self.concurrency
                try:
                    response = await self.http.post(f"{url}/v1/chat/completions", json=chat_body(k))
                except httpx.HTTPError as exc:
                    self._failed(type(exc).__name__)
                    continue
                if response.status_code == 200:
                    self.served += 1
                else:
                    self._failed(str(response.status_code))

        async with trio.open_nursery() as nursery:
            for offset in range(self.concurrency):
                nursery.start_soon(client, offset)

    def _failed(self, why: str) -> None:
        self.failed += 1
        self.errors[why] = self.errors.get(why, 0) + 1


async def wait_serving(http: httpx.AsyncClient, url: str, bound: float) -> float:
    """Poll a chat through `url` until one is answered; the time it was."""
    with trio.fail_after(bound):
        while True:
            try:
                response = await http.post(f"{url}/v1/chat/completions", json=chat_body(0))
                if response.status_code == 200:
                    return time.time()
            except httpx.TransportError:
                pass
            await trio.sleep(0.005)


async def measure_join(
    cluster: Cluster, http: httpx.AsyncClient, master: ClusterNode, trace: Path
) -> dict[str, Any]:
    """A fresh node joins: link-up to its first answered chat, and to its snapshot."""
    trace.write_text("")
    api_port = free_port()
    url = f"http://127.0.0.1:{api_port}"
    served_at = 0.0

    async def poll() -> None:
        nonlocal served_at
        served_at = await wait_serving(http, url, JOIN_TIMEOUT_S)

    started = time.time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll)
        joiner = await cluster.add(
            "--no-model", "--api-port", str(api_port), env={"TREXO_TRACE_FILE": str(trace)}
        )
    events = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    linked = min(
        e["t"] for e in events if e["event"] == "peer_joined" and e["peer"] == master.node_id
    )
    caught_up = [e["t"] for e in events if e["event"] == "view_caught_up"]
    health = (await http.get(f"{url}/health")).json()
    await cluster.stop(joiner)
    return {
        "linkup_to_serving_ms": (served_at - linked) * 1e3,
        "start_to_linkup_ms": (linked - started) * 1e3,
        "linkup_to_caught_up_ms": (min(caught_up) - linked) * 1e3 if caught_up else None,
        "snapshots_applied": health["history"]["snapshots_applied"],
    }


async def soak(root: Path, nodes: int, args: argparse.Namespace) -> dict[str, Any]:
    trace = root / "joiner-trace.jsonl"
    async with open_cluster(root) as cluster:
        master = await cluster.add("--force-master")
        for _ in range(nodes - 1):
            await cluster.add("--no-model")
        await cluster.wait_converged(expect_nodes=nodes, timeout=READY_TIMEOUT_S)
        assert master.process is not None
        pid = master.process.pid
        events_dir = master.data_dir / "events"
        limits = httpx.Limits(max_connections=args.concurrency * 2)
        async with httpx.AsyncClient(timeout=60.0, limits=limits) as http:
            await wait_serving(http, master.url, READY_TIMEOUT_S)
            load = Load(http, [n.url for n in cluster.live()], args.concurrency)
            samples: list[dict[str, Any]] = []
            joins: list[dict[str, Any]] = []
            started = time.monotonic()
            deadline = started + args.max_seconds

            async def sample() -> None:
                health = (await http.get(f"{master.url}/health")).json()
                samples.append(
                    {
                        "t": time.monotonic() - started,
                        "served": load.served,
                        "rss_mib": rss_mib(pid),
                        "events_dir_bytes": tree_bytes(events_dir),
                        **health["history"],
                    }
                )

            async def sampler() -> None:
                while True:
                    await sample()
                    await trio.sleep(args.sample_every)

            targets = [round(args.requests * k / (args.joins - 1)) for k in range(args.joins)]
            load_seconds = 0.0
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sampler)
                for target in targets:
                    began = time.monotonic()
                    await load.run_until(target, deadline)
                    load_seconds += time.monotonic() - began
                    await sample()
                    join = await measure_join(cluster, http, master, trace)
                    joins.append({"served_before": load.served, **join})
                    print(f"{nodes} node(s): {load.served} served, join {join}", flush=True)
                    if time.monotonic() >= deadline:
                        break
                nursery.cancel_scope.cancel()
            await sample()
    warm = next((s for s in samples if s["served"] >= args.warmup), samples[0])
    return {
        "nodes": nodes,
        "served": load.served,
        "failed": load.failed,
        "errors": load.errors,
        "load_seconds": load_seconds,
        "requests_per_s": load.served / load_seconds if load_seconds else 0.0,
        "rss_start_mib": samples[0]["rss_mib"],
        "rss_after_warmup_mib": warm["rss_mib"],
        "rss_end_mib": samples[-1]["rss_mib"],
        "rss_growth_mib": samples[-1]["rss_mib"] - samples[0]["rss_mib"],
        "rss_growth_after_warmup_mib": samples[-1]["rss_mib"] - warm["rss_mib"],
        "max_events_in_memory": max(s.get("events_in_memory", 0) for s in samples),
        "max_events_dir_bytes": max(s["events_dir_bytes"] for s in samples),
        "joins": joins,
        "samples": samples,
    }


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rss, catch_up) = plt.subplots(1, 2, figsize=(11, 4))
    for run in results:
        label = f"{run['nodes']} node(s)"
        served = [s["served"] for s in run["samples"]]
        rss.plot(served, [s["rss_mib"] for s in run["samples"]], label=label)
        catch_up.plot(
            [j["served_before"] for j in run["joins"]],
            [j["linkup_to_serving_ms"] for j in run["joins"]],
            marker="o",
            label=label,
        )
    rss.set(xlabel="requests served", ylabel="master RSS (MiB)", title="master memory")
    catch_up.set(
        xlabel="requests served before the join",
        ylabel="link-up to first answered chat (ms)",
        title="a joiner's catch-up",
    )
    rss.set_ylim(bottom=0)
    catch_up.set_ylim(bottom=0)
    for ax in (rss, catch_up):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


async def main(args: argparse.Namespace) -> None:
    results = []
    for nodes in args.nodes:
        with tempfile.TemporaryDirectory(prefix=f"trexo-soak-{nodes}-") as tmp:
            results.append(await soak(Path(tmp), nodes, args))
    summary = [
        {k: v for k, v in run.items() if k not in ("samples",)}
        | {"median_catch_up_ms": statistics.median(j["linkup_to_serving_ms"] for j in run["joins"])}
        for run in results
    ]
    print(json.dumps(summary, indent=2))
    write_results("soak", {"args": vars(args), "runs": results})
    plot(results, RESULTS_DIR / "soak.png")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--max-seconds", type=float, default=1200.0, help="per configuration")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--joins", type=int, default=5, help="join measurements per run")
    parser.add_argument("--sample-every", type=float, default=5.0)
    parser.add_argument("--warmup", type=int, default=2000, help="requests before the baseline")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 3])
    return parser.parse_args()


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    trio.run(main, parse_args())
