"""Re-election benchmark: how long a cluster is without a master after losing it.

For N node processes (no model), K times: SIGKILL the master (or SIGSTOP it: a frozen node;
or, on the lab of hosts, pull its cable: `cut`) and record, from
the nodes' trace files (`TREXO_TRACE_FILE`) and a probe:

- detection:   the first survivor sees the master's link drop;
- decision:    every survivor has decided the new session;
- swap:        every survivor has started the new session's generation;
- API ready:   a survivor's API accepts a command (a cancel of an unknown request answered
               404 by the new master; 503 while there is none).

`--against REV` runs the same trials with the trexo of git revision REV (a worktree) in
alternating blocks (`--blocks`), so a change is measured against its baseline on the same
machine at the same time; `--loads 0 4` runs each configuration on a quiet machine and with
4 spinning processes per core (`tests/machine_load.py`).

The killed node is restarted (same data dir) before the next trial, so every trial starts
from a healthy cluster of N. Each configuration runs on two networks: `loopback` (every node
on 127.0.0.1 of one network stack, static peers) and `lab` (every node on a host of its own:
a network namespace with its own address, finding the others by multicast; see
`tests/lab/netns.py`; root only, else skipped). Run: `nox -s bench-election` (or
`python bench/bench_election.py --networks loopback`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import RESULTS_DIR, summarize, write_results
from tests.e2e.cluster import Cluster, ClusterNode, open_cluster
from tests.lab.netns import Lab, available, lab
from tests.machine_load import busy_machine

REPO = Path(__file__).resolve().parents[1]

PROBE_TIMEOUT_S = 0.5
PROBE_INTERVAL_S = 0.002
TRIAL_TIMEOUT_S = 30.0
PHASES = ("detection", "decision", "swap", "api_ready")
NETWORKS = ("loopback", "lab")
FAILURE_SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGSTOP": signal.SIGSTOP}
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
    cluster: Cluster, trace_file: Path, failure: str, http: httpx.AsyncClient
) -> dict[str, float]:
    session = await cluster.wait_converged(timeout=TRIAL_TIMEOUT_S)
    master = cluster.by_id(session["master_id"])
    survivors = [n for n in cluster.live() if n is not master]
    assert master.process is not None
    t0 = time.time()
    if failure == "cut":
        assert cluster.lab is not None and master.host is not None
        cluster.lab.cut(master.host)
    else:
        os.kill(master.process.pid, FAILURE_SIGNALS[failure])
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
    if os.environ.get("BENCH_DEBUG"):
        survivors_ids = {n.node_id for n in survivors}
        for e in read_trace(trace_file):
            if e["t"] >= t0 and e["node"] in survivors_ids:
                print(f"  {(e['t'] - t0) * 1e3:7.1f} ms {e['node'][:8]} {e['event']}", flush=True)
    if failure == "SIGSTOP":
        os.kill(master.process.pid, signal.SIGCONT)
    if failure == "cut":
        assert cluster.lab is not None and master.host is not None
        cluster.lab.heal(master.host)
    await cluster.stop(master)
    await cluster.start(master)
    await cluster.wait_converged(expect_nodes=len(cluster.nodes), timeout=TRIAL_TIMEOUT_S)
    return result


def network(name: str, size: int) -> AbstractContextManager[Lab | None]:
    """`size` hosts of a lab, or None: loopback."""
    return lab(size) if name == "lab" else nullcontext()


@attrs.frozen
class Variant:
    """Which trexo the nodes run: this tree, or a baseline revision's worktree."""

    name: str
    entry: tuple[str, ...] = ("-m", "trexo")


@contextlib.contextmanager
def baseline_tree(revision: str) -> Iterator[Path]:
    """A detached worktree of `revision`, removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="trexo-baseline-"))
    tree = root / "tree"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(tree), revision],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    try:
        yield tree
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True
        )
        shutil.rmtree(root, ignore_errors=True)


def tree_entry(tree: Path) -> tuple[str, ...]:
    """`python` arguments that run `tree`'s trexo (ahead of the installed one)."""
    return (
        "-c",
        f"import runpy, sys; sys.path.insert(0, {str(tree)!r}); "
        "runpy.run_module('trexo', run_name='__main__', alter_sys=True)",
    )


async def run_cluster(
    size: int, trials: int, failure: str, root: Path, where: str, variant: Variant
) -> dict[str, list[float]]:
    label = f"{size}-{failure}-{where}-{variant.name}-{time.monotonic_ns()}"
    trace_file = root / f"trace-{label}.jsonl"
    env = {"TREXO_TRACE_FILE": str(trace_file)}
    samples: dict[str, list[float]] = {phase: [] for phase in PHASES}
    with network(where, size) as the_lab:
        async with (
            open_cluster(root / f"cluster-{label}", the_lab, entry=variant.entry) as cluster,
            httpx.AsyncClient() as http,
        ):
            for _ in range(size):
                await cluster.add("--no-model", "-q", env=env)
            await cluster.wait_converged(expect_nodes=size, timeout=TRIAL_TIMEOUT_S)
            for i in range(trials):
                result = await trial(cluster, trace_file, failure, http)
                for phase, value in result.items():
                    samples[phase].append(value)
                shown = ", ".join(f"{p} {result[p] * 1e3:.1f} ms" for p in PHASES if p in result)
                print(
                    f"N={size} {failure} {where} {variant.name} trial {i + 1}: {shown}",
                    flush=True,
                )
    return samples


async def run_interleaved(
    size: int,
    trials: int,
    failure: str,
    root: Path,
    where: str,
    variants: list[Variant],
    blocks: int,
) -> dict[str, dict[str, Any]]:
    """`trials` per variant, in `blocks` alternating blocks (a fresh cluster each)."""
    samples: dict[str, dict[str, list[float]]] = {
        v.name: {phase: [] for phase in PHASES} for v in variants
    }
    per_block = [trials // blocks + (1 if b < trials % blocks else 0) for b in range(blocks)]
    for count in per_block:
        for variant in variants:
            if count == 0:
                continue
            block = await run_cluster(size, count, failure, root, where, variant)
            for phase, values in block.items():
                samples[variant.name][phase] += values
    return {
        name: {phase: summarize(values) for phase, values in phases.items() if values}
        for name, phases in samples.items()
    }


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
        "| cluster | failure | network | load | trexo | phase | median | p90 | max | n |",
        "|---|---|---|---|---|---|---:|---:|---:|---:|",
    ]
    for label, phases in results.items():
        size, failure, where, load, *variant = label.split(" ")
        for phase in PHASES:
            if phase in phases:
                s = phases[phase]
                lines.append(
                    f"| {size} | {failure} | {where} | {load} | {' '.join(variant) or 'this'}"
                    f" | {phase} | {s['median_ms']:.1f} ms"
                    f" | {s['p90_ms']:.1f} ms | {s['max_ms']:.1f} ms | {s['n']} |"
                )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> None:
    networks = list(args.networks)
    if "lab" in networks and (why := available()) is not None:
        print(f"no lab of hosts here ({why}): loopback only")
        networks.remove("lab")
    runs = [
        *((size, "SIGKILL", args.trials) for size in args.sizes),
        *((size, "SIGSTOP", args.stop_trials) for size in args.stop_sizes),
        *((size, "cut", args.cut_trials) for size in args.cut_sizes),
    ]
    with contextlib.ExitStack() as trees:
        variants = [Variant("this")]
        if args.against:
            tree = trees.enter_context(baseline_tree(args.against))
            variants.append(Variant(args.against, tree_entry(tree)))
        results = await measure(args, runs, networks, variants)
    path = write_results(
        "election",
        {
            "trials": args.trials,
            "stop_trials": args.stop_trials,
            "cut_trials": args.cut_trials,
            "against": args.against,
            "loads": args.loads,
            "exo": EXO_POLICY,
            "results": results,
        },
    )
    plot(results, RESULTS_DIR / "election.png")
    print(markdown(results))
    print(f"written to {path}")


async def measure(
    args: argparse.Namespace,
    runs: Sequence[tuple[int, str, int]],
    networks: list[str],
    variants: list[Variant],
) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for load in args.loads:
            with busy_machine(per_core=load) if load else contextlib.nullcontext():
                for size, failure, trials in runs:
                    for where in networks:  # side by side: one configuration on each network
                        if failure == "cut" and where != "lab":
                            continue  # a cable to pull: only hosts of their own have one
                        by_variant = await run_interleaved(
                            size, trials, failure, root, where, variants, args.blocks
                        )
                        for name, phases in by_variant.items():
                            name_part = "" if len(variants) == 1 else f" {name}"
                            label = f"N={size} {failure} {where} load={load}{name_part}"
                            results[label] = phases
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-k", "--trials", type=int, default=20)
    parser.add_argument("--sizes", type=int, nargs="*", default=[2, 3, 5])
    parser.add_argument("--stop-trials", type=int, default=10)
    parser.add_argument("--stop-sizes", type=int, nargs="*", default=[3])
    parser.add_argument("--cut-trials", type=int, default=10)
    parser.add_argument("--cut-sizes", type=int, nargs="*", default=[3])
    parser.add_argument("--networks", nargs="*", choices=NETWORKS, default=list(NETWORKS))
    parser.add_argument(
        "--against", metavar="REV", help="also run git revision REV's trexo, interleaved"
    )
    parser.add_argument("--blocks", type=int, default=4, help="alternating blocks per variant")
    parser.add_argument(
        "--loads",
        type=int,
        nargs="*",
        default=[0],
        help="spinning processes per core while measuring (0: quiet); one run each",
    )
    trio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
