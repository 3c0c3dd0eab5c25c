"""Failover with a loaded model: what a user of the survivors sees when the master dies.

Four `trexo run` processes on loopback (static peers): two masters-to-be (`--force-master`),
so that whenever the master is killed the other one takes over and followers B and C stay
followers through every trial, and B and C. Two instances of the small demo
model (20 M parameters) are placed on follower B, so a new request is not queued behind the
stream in flight. Each trial: a greedy stream runs through follower C's API; at its first
token the master is SIGKILLed; at once a new request is sent through C. Recorded per trial:

- first token: SIGKILL to the first content token of the new request (a chat, as users send);
- stream intact: the in-flight stream completed without error, with the text of an
  undisturbed run of the same request;
- runners kept: B's runner pids are the same before and after;
- generation exit: on each survivor, from deciding the new session to the old generation's
  nursery having exited (from the nodes' trace files).

The killed node is restarted (same data dir) before the next trial. Run: `nox -s bench-failover`;
`-- --network lab` runs the four nodes on hosts of their own (network namespaces, multicast
discovery; results in `failover-lab.json`); `-- --load 4` runs it with 4 spinning processes
per core (`failover-load4.json`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_election import NETWORKS, network, read_trace
from bench.stats import markdown_table, summarize, write_results
from tests.e2e.cluster import Cluster, ClusterNode, open_cluster
from tests.machine_load import busy_machine

MODEL = "trexo-demo-small"
MESSAGES = [{"role": "user", "content": "Explain the for statement."}]
STREAM_TOKENS = 64
PROBE_TOKENS = 4
TRIAL_TIMEOUT_S = 60.0
NODES = 4


def client(node: ClusterNode) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0)


async def stream(node: ClusterNode, max_tokens: int, on_first: Any = None) -> tuple[str, float]:
    """The streamed text and the time of its first content token; calls `on_first()` then."""
    response = await client(node).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        stream=True,
    )
    text, first = "", 0.0
    async for chunk in response:
        if chunk.choices and chunk.choices[0].delta.content:
            if not text:
                first = time.time()
                if on_first is not None:
                    on_first()
            text += chunk.choices[0].delta.content
    return text, first


def generation_exits(
    events: list[dict[str, Any]], t0: float, survivors: set[str], old_clock: int
) -> list[float]:
    """Per survivor: new session decided -> the old generation's nursery exited."""
    decided: dict[str, float] = {}
    exited: dict[str, float] = {}
    for e in events:
        if e["t"] < t0 or e["node"] not in survivors:
            continue
        if e["event"] == "session_decided" and e["clock"] > old_clock:
            decided.setdefault(e["node"], e["t"])
        if e["event"] == "generation_exited" and e["clock"] == old_clock:
            exited.setdefault(e["node"], e["t"])
    return [exited[n] - decided[n] for n in survivors if n in exited and n in decided]


async def baseline(c: ClusterNode) -> float:
    """The same pair with no failure: a stream in flight, a new request at its first token;
    seconds from sending the new request to its first token."""
    started = trio.Event()
    sent = 0.0
    first = 0.0

    def go() -> None:
        started.set()

    async def new_request() -> None:
        nonlocal sent, first
        await started.wait()
        sent = time.time()
        _, first = await stream(c, PROBE_TOKENS)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream, c, STREAM_TOKENS, go)
        nursery.start_soon(new_request)
    return first - sent


async def trial(
    cluster: Cluster, b: ClusterNode, c: ClusterNode, trace_file: Path, undisturbed: str
) -> dict[str, Any]:
    session = await cluster.wait_converged(timeout=TRIAL_TIMEOUT_S)
    master = cluster.by_id(session["master_id"])
    assert b.process is not None and master.process is not None
    runners = sorted(b.process.runner_pids())
    killed = trio.Event()
    t0 = 0.0

    def kill() -> None:
        nonlocal t0
        assert master.process is not None
        t0 = time.time()
        os.kill(master.process.pid, signal.SIGKILL)
        killed.set()

    outcome: dict[str, Any] = {}

    async def in_flight() -> None:
        try:
            text, _ = await stream(c, STREAM_TOKENS, on_first=kill)
            outcome["stream_intact"] = text == undisturbed
        except openai.APIError as exc:
            outcome["stream_intact"] = False
            outcome["stream_error"] = str(exc)

    async def new_request() -> None:
        await killed.wait()
        try:
            _, first = await stream(c, PROBE_TOKENS)
            outcome["first_token_s"] = first - t0
        except openai.APIError as exc:
            outcome["first_token_s"] = None
            outcome["request_error"] = str(exc)

    with trio.fail_after(TRIAL_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(in_flight)
            nursery.start_soon(new_request)
    await trio.sleep(0.3)  # let the trace files catch up
    survivors = {n.node_id for n in cluster.live() if n is not master}
    outcome["generation_exit_s"] = generation_exits(
        read_trace(trace_file), t0, survivors, session["clock"]
    )
    outcome["runners_kept"] = sorted(b.process.runner_pids()) == runners
    await cluster.stop(master)
    await cluster.start(master)
    await cluster.wait_converged(expect_nodes=len(cluster.nodes), timeout=TRIAL_TIMEOUT_S)
    return outcome


async def wait_ready(http: httpx.AsyncClient, node: ClusterNode, instances: int) -> None:
    with trio.fail_after(TRIAL_TIMEOUT_S):
        while True:
            state = (await http.get(f"{node.url}/state")).json()
            ready = [r for r in state["runners"].values() if r["status"]["type"] == "RunnerReady"]
            if len(ready) >= instances:
                return
            await trio.sleep(0.05)


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        trace_file = root / "trace.jsonl"
        env = {"TREXO_TRACE_FILE": str(trace_file)}
        with network(args.network, NODES) as the_lab:
            async with (
                open_cluster(root / "cluster", the_lab) as cluster,
                httpx.AsyncClient() as http,
            ):
                for _ in range(2):
                    await cluster.add("--no-model", "-q", "--force-master", env=env)
                b = await cluster.add("--no-model", "-q", env=env)
                c = await cluster.add("--no-model", "-q", env=env)
                await cluster.wait_converged(expect_nodes=NODES, timeout=TRIAL_TIMEOUT_S)
                for _ in range(2):
                    placed = await http.post(
                        f"{c.url}/instances", json={"model": MODEL, "node_id": b.node_id}
                    )
                    placed.raise_for_status()
                await wait_ready(http, c, 2)
                undisturbed, _ = await stream(c, STREAM_TOKENS)
                trials = []
                for i in range(args.trials):
                    calm = await baseline(c)
                    outcome = await trial(cluster, b, c, trace_file, undisturbed)
                    outcome["baseline_first_token_s"] = calm
                    trials.append(outcome)
                    exits = ", ".join(f"{x * 1e3:.1f}" for x in outcome["generation_exit_s"])
                    first = outcome["first_token_s"]
                    shown = "failed" if first is None else f"{first * 1e3:.1f} ms"
                    print(
                        f"trial {i + 1}: first token {shown} (no failure: {calm * 1e3:.1f} ms), "
                        f"stream intact {outcome['stream_intact']}, runners kept "
                        f"{outcome['runners_kept']}, generation exits [{exits}] ms",
                        flush=True,
                    )
                    # The next master is a survivor; the restarted node joins as a follower.
                    await wait_ready(http, c, 2)
    results = {
        "first_token": summarize([t["first_token_s"] for t in trials if t["first_token_s"]]),
        "baseline_first_token": summarize([t["baseline_first_token_s"] for t in trials]),
        "extra_first_token": summarize(
            [t["first_token_s"] - t["baseline_first_token_s"] for t in trials if t["first_token_s"]]
        ),
        "requests_failed": sum(t["first_token_s"] is None for t in trials),
        "generation_exit": summarize([x for t in trials for x in t["generation_exit_s"]]),
        "streams_intact": sum(t["stream_intact"] for t in trials),
        "runners_kept": sum(t["runners_kept"] for t in trials),
        "trials": len(trials),
    }
    name = "failover" if args.network == "loopback" else f"failover-{args.network}"
    if args.load:
        name += f"-load{args.load}"
    path = write_results(name, {"model": MODEL, "per_trial": trials, "results": results})
    rows = {
        "SIGKILL of the master → first token of a new chat": results["first_token"],
        "the same new chat with no failure → first token": results["baseline_first_token"],
        "extra time to first token (per trial)": results["extra_first_token"],
        "new session decided → old generation exited (per survivor)": results["generation_exit"],
    }
    print(
        markdown_table(rows) + "\n"
        f"\nin-flight streams intact: {results['streams_intact']}/{len(trials)}; "
        f"runners kept: {results['runners_kept']}/{len(trials)}; "
        f"new requests failed: {results['requests_failed']}/{len(trials)}"
    )
    print(f"written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-k", "--trials", type=int, default=20)
    parser.add_argument("--network", choices=NETWORKS, default="loopback")
    parser.add_argument(
        "--load", type=int, default=0, help="spinning processes per core while it runs"
    )
    args = parser.parse_args()
    with busy_machine(per_core=args.load) if args.load else contextlib.nullcontext():
        trio.run(main_async, args)


if __name__ == "__main__":
    main()
