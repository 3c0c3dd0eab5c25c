"""Re-election benchmark: how long a cluster is without a master after losing it.

For N node processes (no model), K times: SIGKILL (or SIGSTOP) the master and record, from
the nodes' trace files (`TREXO_TRACE_FILE`) and a probe:

- detection:   the first survivor sees the master's link drop;
- decision:    every survivor has decided the new session;
- swap:        every survivor has started the new session's generation;
- API ready:   a survivor's API accepts a command (a cancel of an unknown request answered
               404 by the new master; 503 while there is none).

The killed node is restarted (same data dir) before the next trial, so every trial starts
from a healthy cluster of N. Each configuration runs on two networks: `loopback` (every node
on 127.0.0.1 of one network stack, static peers) and `lab` (every node on a host of its own:
a network namespace with its own address, finding the others by multicast; see
`tests/lab/netns.py`; root only, else skipped). Run: `nox -s bench-election` (or
`python bench/bench_election.py --networks loopback`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import RESULTS_DIR, summarize, write_results
from tests.e2e.cluster import Cluster, ClusterNode, open_cluster
from tests.lab.netns import Lab, available, lab

PROBE_TIMEOUT_S = 0.5
PROBE_INTERVAL_S = 0.002
TRIAL_TIMEOUT_S = 30.0
PHASES = ("detection", "decision", "swap", "api_ready")
NETWORKS = ("loopback", "lab")
EXO_POLICY = "0.2 s debounce + 3.0 s campaign after any link event: >= 3.2 s per re-election"


def read_trace(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def api_ready_after(http: httpx.AsyncClient, node: ClusterNode, t0: float) -> float:
    """Seconds from `t0` until `node`'s API has a master that answers commands."""
    with trio.fail_after(TRIAL_TIMEOUT_S):
        while True:
            try:
                response = await http.post(
                    f"{node.url}/v1/cancel/bench-probe", timeout=PROBE_TIMEOUT_S
                )
                if response.status_code == 404:
                    return time.time() - t0
                if os.environ.get("BENCH_DEBUG"):
                    print(f"probe: {response.status_code} at {time.time() - t0:.3f}", flush=True)
            except httpx.TransportError as exc:
                if os.environ.get("BENCH_DEBUG"):
                    print(f"probe: {exc!r} at {time.time() - t0:.3f}", flush=True)
            await trio.sleep(PROBE_INTERVAL_S)


def phases_from_trace(
    events: list[dict[str, Any]], t0: float, old_master: str, survivors: set[str], old_clock: int
) -> dict[str, float]:
    after = [e for e in events if e["t"] >= t0 and e["node"] in survivors]
    lost = [e["t"] for e in after if e["event"] == "peer_lost" and e["peer"] == old_master]
    decided: dict[str, float] = {}
    started: dict[str, float] = {}
    for e in after:
        if e["event"] == "session_decided" and e["clock"] > old_clock:
            decided.setdefault(e["node"], e["t"])
        if e["event"] == "generation_started" and e["clock"] > old_clock:
            started.setdefault(e["node"], e["t"])
    out = {}
    if lost:
        out["detection"] = min(lost) - t0
    if len(decided) == len(survivors):
        out["decision"] = max(decided.values()) - t0
    if len(started) == len(survivors):
        out["swap"] = max(started.values()) - t0
    return out


async def trial(
    cluster: Cluster, trace_file: Path, sig: int, http: httpx.AsyncClient
) -> dict[str, float]:
    session = await cluster.wait_converged(timeout=TRIAL_TIMEOUT_S)
    master = cluster.by_id(session["master_id"])
    survivors = [n for n in cluster.live() if n is not master]
    assert master.process is not None
    t0 = time.time()
    os.kill(master.process.pid, sig)
    ready = await api_ready_after(http, survivors[0], t0)
    await trio.sleep(0.2)  # let the trace files catch up
    result = phases_from_trace(
        read_trace(trace_file),
        t0,
        master.node_id,
        {n.node_id for n in survivors},
        session["clock"],
    )
    result["api_ready"] = ready
    if sig == signal.SIGSTOP:
        os.kill(master.process.pid, signal.SIGCONT)
    await cluster.stop(master)
    await cluster.start(master)
    await cluster.wait_converged(expect_nodes=len(cluster.nodes), timeout=TRIAL_TIMEOUT_S)
    return result


def network(name: str, size: int) -> AbstractContextManager[Lab | None]:
    """`size` hosts of a lab, or None: loopback."""
    return lab(size) if name == "lab" else nullcontext()


async def run_cluster(size: int, trials: int, sig: int, root: Path, where: str) -> dict[str, Any]:
    label = f"{size}-{sig}-{where}"
    trace_file = root / f"trace-{label}.jsonl"
    env = {"TREXO_TRACE_FILE": str(trace_file)}
    samples: dict[str, list[float]] = {phase: [] for phase in PHASES}
    with network(where, size) as the_lab:
        async with (
            open_cluster(root / f"cluster-{label}", the_lab) as cluster,
            httpx.AsyncClient() as http,
        ):
            for _ in range(size):
                await cluster.add("--no-model", "-q", env=env)
            await cluster.wait_converged(expect_nodes=size, timeout=TRIAL_TIMEOUT_S)
            for i in range(trials):
                result = await trial(cluster, trace_file, sig, http)
                for phase, value in result.items():
                    samples[phase].append(value)
                shown = ", ".join(f"{p} {result[p] * 1e3:.1f} ms" for p in PHASES if p in result)
                print(
                    f"N={size} {signal.Signals(sig).name} {where} trial {i + 1}: {shown}",
                    flush=True,
                )
    return {phase: summarize(values) for phase, values in samples.items() if values}


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install -e '.[bench]')")
        return
    labels = list(results)
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / len(PHASES)
    for k, phase in enumerate(PHASES):
        medians = [results[label].get(phase, {}).get("median_ms", 0.0) for label in labels]
        p90s = [results[label].get(phase, {}).get("p90_ms", 0.0) for label in labels]
        xs = [i + k * width for i in range(len(labels))]
        ax.bar(xs, medians, width, label=f"{phase} (median)")
        ax.scatter(xs, p90s, marker="_", color="black", s=120, zorder=3)
    ax.axhline(3200, color="red", linestyle="--", label="exo: 0.2 s debounce + 3.0 s campaign")
    ax.set_yscale("log")
    ax.set_ylabel("ms after the master is killed (log scale; dash = p90)")
    ax.set_xticks(
        [i + 0.4 - width / 2 for i in range(len(labels))],
        [label.replace(" ", "\n") for label in labels],
        fontsize=8,
    )
    ax.set_title("trexo re-election: loopback and a lab of hosts (network namespaces)")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


def markdown(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| cluster | failure | network | phase | median | p90 | max | n |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for label, phases in results.items():
        size, failure, where = label.split(" ")
        for phase in PHASES:
            if phase in phases:
                s = phases[phase]
                lines.append(
                    f"| {size} | {failure} | {where} | {phase} | {s['median_ms']:.1f} ms"
                    f" | {s['p90_ms']:.1f} ms | {s['max_ms']:.1f} ms | {s['n']} |"
                )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> None:
    results: dict[str, dict[str, Any]] = {}
    networks = list(args.networks)
    if "lab" in networks and (why := available()) is not None:
        print(f"no lab of hosts here ({why}): loopback only")
        networks.remove("lab")
    runs = [(size, signal.SIGKILL, args.trials) for size in args.sizes] + [
        (size, signal.SIGSTOP, args.stop_trials) for size in args.stop_sizes
    ]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for size, sig, trials in runs:
            for where in networks:  # side by side: the same configuration on each network
                label = f"N={size} {signal.Signals(sig).name} {where}"
                results[label] = await run_cluster(size, trials, sig, root, where)
    path = write_results(
        "election",
        {
            "trials": args.trials,
            "stop_trials": args.stop_trials,
            "exo": EXO_POLICY,
            "results": results,
        },
    )
    plot(results, RESULTS_DIR / "election.png")
    print(markdown(results))
    print(f"written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-k", "--trials", type=int, default=20)
    parser.add_argument("--sizes", type=int, nargs="*", default=[2, 3, 5])
    parser.add_argument("--stop-trials", type=int, default=10)
    parser.add_argument("--stop-sizes", type=int, nargs="*", default=[3])
    parser.add_argument("--networks", nargs="*", choices=NETWORKS, default=list(NETWORKS))
    trio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
