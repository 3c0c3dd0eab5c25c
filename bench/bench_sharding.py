"""One model split across nodes: decode speed, first token and teardown, through the API.

Three `trexo run` processes on loopback (static peers), the small demo model (20 M
parameters). Each trial places, in turn, the model whole on one node, pipeline-split over 2
and over 3 nodes, and tensor-split over 2 nodes (always through node A's API, and always
with node A as rank 0), waits until it serves, and measures a greedy chat stream as users
send it (the openai client): time to first token and decode time per token (first token
to last, over the tokens after the first). Ratios are against the single node of the same
trial. Then, with a 2-node pipeline instance serving a stream:

- SIGKILL of rank 1's runner -> every rank's runner process of the instance has exited;
- SIGSTOP of rank 1's node -> rank 0's runner has exited (the node then gets SIGCONT and a
  restart).

With `--archs` (`nox -s bench-sharding -- --archs`), instead: per zoo architecture (dense,
mixture of experts, sliding window, latent attention by default), on 2 nodes, time per
token of a pipeline and a tensor split against the whole model. The zoo's models are tiny
(64 wide): the figures are what splitting costs per token beyond the compute, by
architecture.

Run: `nox -s bench-sharding` (`-- -k 5` for trials).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
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

from bench.stats import RESULTS_DIR, markdown_table, summarize, write_results
from tests.e2e.cluster import Cluster, ClusterNode, open_cluster

MODEL = "trexo-demo-small"
MESSAGES = [{"role": "user", "content": "Explain the for statement."}]
DECODE_TOKENS = 64
STEP_S = 0.005
READY_TIMEOUT_S = 120.0
TEARDOWN_TIMEOUT_S = 30.0
ARCH_LAYOUTS: dict[str, dict[str, Any]] = {
    "1 node": {"nodes": 1, "sharding": "auto"},
    "pipeline, 2 nodes": {"nodes": 2, "sharding": "pipeline"},
    "tensor, 2 nodes": {"nodes": 2, "sharding": "tensor"},
}
"""The layouts of the architecture axis (`--archs`)."""
DEFAULT_ARCHS = "llama,qwen3_moe,gemma3_text,deepseek_v3"
"""Dense, mixture of experts, sliding window, latent attention."""
LAYOUTS: dict[str, dict[str, Any]] = {
    "1 node": {"nodes": 1, "sharding": "auto"},
    "pipeline, 2 nodes": {"nodes": 2, "sharding": "pipeline"},
    "pipeline, 3 nodes": {"nodes": 3, "sharding": "pipeline"},
    "tensor, 2 nodes": {"nodes": 2, "sharding": "tensor"},
}


def client(node: ClusterNode) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0)


async def timed_stream(node: ClusterNode, max_tokens: int, model: str = MODEL) -> dict[str, float]:
    """A greedy chat stream: time to its first token, and per token after that."""
    sent = time.perf_counter()
    response = await client(node).chat.completions.create(
        model=model,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    first = last = 0.0
    tokens = 0
    async for chunk in response:
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return {"ttft_s": first - sent, "per_token_s": (last - first) / max(1, tokens - 1)}


async def place(
    http: httpx.AsyncClient,
    via: ClusterNode,
    nodes: list[ClusterNode],
    layout: dict[str, Any],
    model: str = MODEL,
) -> str:
    body = {
        "model": model,
        "sharding": layout["sharding"],
        "node_ids": [n.node_id for n in nodes[: layout["nodes"]]],
    }
    response = await http.post(f"{via.url}/instances", json=body)
    response.raise_for_status()
    instance_id: str = response.json()["instance_id"]
    return instance_id


async def wait_serving(via: ClusterNode, model: str = MODEL) -> float:
    """Until a chat is answered (bring-up done); seconds it took."""
    started = time.perf_counter()
    with trio.fail_after(READY_TIMEOUT_S):
        while True:
            try:
                await client(via).chat.completions.create(
                    model=model,
                    messages=MESSAGES,  # type: ignore[arg-type]
                    max_tokens=1,
                )
                return time.perf_counter() - started
            except openai.APIError:
                await trio.sleep(0.05)


async def delete(http: httpx.AsyncClient, via: ClusterNode, instance_id: str) -> None:
    (await http.delete(f"{via.url}/instances/{instance_id}")).raise_for_status()
    with trio.fail_after(TEARDOWN_TIMEOUT_S):
        while (await http.get(f"{via.url}/state")).json()["instances"]:
            await trio.sleep(0.05)


def runner_pids(node: ClusterNode) -> set[int]:
    assert node.process is not None
    return set(node.process.runner_pids())


async def wait_exited(pids: set[int]) -> float:
    """Until none of `pids` is alive (zombies count as exited); seconds it took."""
    started = time.perf_counter()
    with trio.fail_after(TEARDOWN_TIMEOUT_S):
        while any(_alive(pid) for pid in pids):
            await trio.sleep(STEP_S)
    return time.perf_counter() - started


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def stream_in_background(node: ClusterNode, outcome: dict[str, Any]) -> None:
    try:
        await timed_stream(node, 4000)
        outcome["error"] = None
    except openai.APIError as exc:
        outcome["error"] = f"{type(exc).__name__}: {exc}"


def keep_logs(cluster: Cluster, why: str) -> Path:
    """Copy every node's logs out of the temporary data directory; where they went."""
    kept = Path(tempfile.mkdtemp(prefix=f"bench-sharding-{why}-"))
    for node in cluster.nodes:
        shutil.copytree(node.data_dir / "logs", kept / node.name, dirs_exist_ok=True)
    return kept


async def teardown_trial(
    cluster: Cluster, http: httpx.AsyncClient, a: ClusterNode, b: ClusterNode, how: str
) -> dict[str, Any]:
    instance_id = await place(http, a, [a, b], {"nodes": 2, "sharding": "pipeline"})
    await wait_serving(a)
    rank0, rank1 = runner_pids(a), runner_pids(b)
    outcome: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream_in_background, a, outcome)
        await trio.sleep(0.3)  # the stream is decoding
        assert b.process is not None
        try:
            if how == "SIGKILL of rank 1's runner":
                os.kill(next(iter(rank1)), signal.SIGKILL)
                outcome["teardown_s"] = await wait_exited(rank0 | rank1)
            else:
                os.kill(b.process.pid, signal.SIGSTOP)
                try:
                    outcome["teardown_s"] = await wait_exited(rank0)
                finally:
                    os.kill(b.process.pid, signal.SIGCONT)
        except trio.TooSlowError:
            outcome["teardown_s"] = None
            kept = keep_logs(cluster, "stuck")
            print(f"not torn down within {TEARDOWN_TIMEOUT_S:g} s; node logs in {kept}")
    if how != "SIGKILL of rank 1's runner":
        await cluster.stop(b)
        await cluster.start(b)
    await cluster.wait_converged(expect_nodes=len(cluster.nodes), timeout=READY_TIMEOUT_S)
    state = (await http.get(f"{a.url}/state")).json()
    for iid in list(state["instances"]):
        await delete(http, a, iid)
    del instance_id
    return outcome


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=args.data_dir) as tmp:
        async with open_cluster(Path(tmp)) as cluster, httpx.AsyncClient(timeout=30) as http:
            nodes = await cluster.add_many(3, "--no-model", "-q")
            await cluster.wait_converged(expect_nodes=3, timeout=READY_TIMEOUT_S)
            a = nodes[0]
            trials: list[dict[str, Any]] = []
            for k in range(args.trials):
                trial: dict[str, Any] = {}
                for name, layout in LAYOUTS.items():
                    instance_id = await place(http, a, nodes, layout)
                    bring_up = await wait_serving(a)
                    runs = [await timed_stream(a, DECODE_TOKENS) for _ in range(args.streams)]
                    trial[name] = {
                        "bring_up_s": bring_up,
                        "ttft_s": statistics.median(r["ttft_s"] for r in runs),
                        "per_token_s": statistics.median(r["per_token_s"] for r in runs),
                    }
                    await delete(http, a, instance_id)
                trials.append(trial)
                line = ", ".join(
                    f"{name}: {v['per_token_s'] * 1e3:.1f} ms/token" for name, v in trial.items()
                )
                print(f"trial {k + 1}: {line}", flush=True)
            teardowns: dict[str, list[dict[str, Any]]] = {}
            for how in ("SIGKILL of rank 1's runner", "SIGSTOP of rank 1's node"):
                for k in range(args.teardowns):
                    try:
                        outcome = await teardown_trial(cluster, http, a, nodes[1], how)
                    except Exception:
                        print(f"{how} #{k + 1} failed; node logs in {keep_logs(cluster, 'failed')}")
                        raise
                    teardowns.setdefault(how, []).append(outcome)
                    print(f"{how} #{k + 1}: {outcome}", flush=True)
    results: dict[str, Any] = {}
    for name in LAYOUTS:
        per_token = [t[name]["per_token_s"] for t in trials]
        results[name] = {
            "per_token": summarize(per_token),
            "tokens_per_s": 1 / statistics.median(per_token),
            "ttft": summarize([t[name]["ttft_s"] for t in trials]),
            "bring_up": summarize([t[name]["bring_up_s"] for t in trials]),
            "per_token_ratio": statistics.median(
                t[name]["per_token_s"] / t["1 node"]["per_token_s"] for t in trials
            ),
            "ttft_ratio": statistics.median(
                t[name]["ttft_s"] / t["1 node"]["ttft_s"] for t in trials
            ),
        }
    for how, outcomes in teardowns.items():
        results[how] = {
            "teardown": summarize([o["teardown_s"] for o in outcomes if o["teardown_s"]]),
            "not_torn_down": sum(o["teardown_s"] is None for o in outcomes),
            "streams_told": sum(o.get("error") is not None for o in outcomes),
            "trials": len(outcomes),
        }
    path = write_results(
        "sharding",
        {"model": MODEL, "per_trial": trials, "teardowns": teardowns, "results": results},
    )
    rows = {f"{name}: time per token": results[name]["per_token"] for name in LAYOUTS}
    rows |= {f"{name}: time to first token": results[name]["ttft"] for name in LAYOUTS}
    rows |= {f"{how} → instance torn down": results[how]["teardown"] for how in teardowns}
    print(markdown_table(rows))
    for name in LAYOUTS:
        r = results[name]
        print(
            f"{name}: {r['tokens_per_s']:.0f} tok/s, per token x{r['per_token_ratio']:.2f}, "
            f"first token x{r['ttft_ratio']:.2f} of one node"
        )
    print(f"written to {path}")
    plot(results, RESULTS_DIR / "sharding.png")


async def architecture_axis(args: argparse.Namespace) -> None:
    """Per zoo architecture, on 2 nodes: time per token of a pipeline and a tensor split
    against the whole model, layouts interleaved within each trial."""
    from trexo.engine.zoo import ensure_zoo_model

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=args.data_dir) as tmp:
        for arch in args.archs.split(","):
            path = ensure_zoo_model(Path(tmp) / "zoo", arch)
            async with (
                open_cluster(Path(tmp) / arch) as cluster,
                httpx.AsyncClient(timeout=30) as http,
            ):
                nodes = await cluster.add_many(2, "--model", str(path), "-q")
                await cluster.wait_converged(expect_nodes=2, timeout=READY_TIMEOUT_S)
                a = nodes[0]
                for iid in list((await http.get(f"{a.url}/state")).json()["instances"]):
                    await delete(http, a, iid)
                trials: list[dict[str, float]] = []
                for k in range(args.trials):
                    trial: dict[str, float] = {}
                    for name, layout in ARCH_LAYOUTS.items():
                        instance_id = await place(http, a, nodes, layout, path.name)
                        await wait_serving(a, path.name)
                        runs = [
                            await timed_stream(a, DECODE_TOKENS, path.name)
                            for _ in range(args.streams)
                        ]
                        trial[name] = statistics.median(r["per_token_s"] for r in runs)
                        await delete(http, a, instance_id)
                    trials.append(trial)
                    line = ", ".join(f"{n}: {v * 1e3:.1f} ms/token" for n, v in trial.items())
                    print(f"{arch} trial {k + 1}: {line}", flush=True)
            results[arch] = {
                name: {
                    "per_token": summarize([t[name] for t in trials]),
                    "ratio": statistics.median(t[name] / t["1 node"] for t in trials),
                }
                for name in ARCH_LAYOUTS
            }
    path = write_results("sharding-architectures", {"results": results})
    print("| architecture | " + " | ".join(ARCH_LAYOUTS) + " |")
    print("|---|" + "---:|" * len(ARCH_LAYOUTS))
    for arch, by_layout in results.items():
        cells = [
            f"{v['per_token']['median_ms']:.1f} ms ({v['ratio']:.2f}x)" for v in by_layout.values()
        ]
        print(f"| {arch} | " + " | ".join(cells) + " |")
    print(f"written to {path}")


def plot(results: dict[str, Any], path: Path) -> None:
    """Time per token and to first token per layout; teardown after each failure."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install -e '.[bench]')")
        return
    fig, (speed, teardown) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = [name for name in LAYOUTS if name in results]
    for k, (measure, title) in enumerate((("per_token", "per token"), ("ttft", "first token"))):
        xs = [i + k * 0.4 for i in range(len(labels))]
        speed.bar(xs, [results[n][measure]["median_ms"] for n in labels], 0.4, label=title)
        p90s = [results[n][measure]["p90_ms"] for n in labels]
        speed.scatter(xs, p90s, marker="_", color="black", s=120, zorder=3)
    speed.set_yscale("log")
    speed.set_ylabel("ms (median; dash = p90; log scale)")
    speed.set_xticks([i + 0.2 for i in range(len(labels))], labels, fontsize=8)
    speed.set_title(f"{MODEL} through the API")
    speed.legend(fontsize=8)
    failures = [how for how in results if "teardown" in results[how]]
    medians = [results[how]["teardown"]["median_ms"] for how in failures]
    teardown.bar(range(len(failures)), medians, 0.5)
    teardown.scatter(
        range(len(failures)),
        [results[how]["teardown"]["p90_ms"] for how in failures],
        marker="_",
        color="black",
        s=120,
        zorder=3,
    )
    teardown.set_xticks(range(len(failures)), failures, fontsize=8)
    teardown.set_ylabel("ms until the instance's runners exited")
    teardown.set_title("teardown of a 2-node pipeline")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-k", "--trials", type=int, default=5)
    parser.add_argument("--streams", type=int, default=3, help="streams per layout per trial")
    parser.add_argument("--teardowns", type=int, default=5, help="trials of each failure")
    parser.add_argument("--data-dir", help="where the nodes' data directories go (a temporary one)")
    parser.add_argument("--plot-only", action="store_true", help="plot the last results again")
    parser.add_argument(
        "--archs",
        nargs="?",
        const=DEFAULT_ARCHS,
        help=f"instead: the architecture axis, for these zoo architectures ({DEFAULT_ARCHS})",
    )
    args = parser.parse_args()
    if args.archs:
        trio.run(architecture_axis, args)
        return
    if args.plot_only:
        saved = json.loads((RESULTS_DIR / "sharding.json").read_text())
        plot(saved["results"], RESULTS_DIR / "sharding.png")
        return
    trio.run(main_async, args)


if __name__ == "__main__":
    main()
