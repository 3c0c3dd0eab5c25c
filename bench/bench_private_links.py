"""What encrypting the peer links costs: encrypted links (this tree) against plain ones (the last
commit before them, `--baseline-ref`, unpacked with `git archive` into a temporary directory
and run through `PYTHONPATH`: links are always encrypted, there is no switch to turn it off).

- seal + open: CPU per message of several sizes (ChaCha20-Poly1305, this process);
- handshake crypto: X25519 key pairs, the exchange and HKDF for both sides (this process);
- link-up: `Transport.connect` between two in-process transports on loopback (TCP, websocket
  upgrade, handshake), in a subprocess per tree, interleaved;
- decode across a link: two `trexo run` nodes, the demo model on B, greedy streamed chats
  through A's API (every chunk crosses the link): time to first token and ms per token after
  it, clusters of both trees interleaved;
- failover: bench-election's trial (3 nodes, SIGKILL of the master, until a survivor's API has
  a new master) with each tree, interleaved.

Run: `nox -s bench-private-links` (or `python bench/bench_private_links.py`). Results go to
`bench/results/private_links.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_election import trial  # noqa: E402
from bench.stats import describe, summarize, write_results  # noqa: E402
from tests.e2e.cluster import open_cluster  # noqa: E402

BASELINE_REF = "6c3be82"
"""The last commit whose links were plain (protocol version 1)."""
SIZES = (200, 2_000, 16_384, 262_144)
"""An election message, a streamed chunk, a command with a long prompt, a large one."""
MODEL = "trexo-demo-tiny"
"""The fastest model: the link's share of each token is the largest it can be here."""
PROMPT = "Tell me about generators, iterators and the difference between them."


# --- in this process: the crypto alone ---------------------------------------------------------


def per_op_us(operation: Callable[[], object], count: int, rounds: int = 7) -> dict[str, float]:
    """Median (and min, max) over `rounds` of the mean microseconds per call of `operation`."""
    for _ in range(count):  # warm-up: caches, lazy initialisation
        operation()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(count):
            operation()
        times.append((time.perf_counter() - started) / count * 1e6)
    return {"median_us": statistics.median(times), "min_us": min(times), "max_us": max(times)}


def crypto_costs() -> dict[str, Any]:
    from trexo.net import handshake as hs
    from trexo.net.secure_channel import EphemeralKey, SecureChannel
    from trexo.types.ids import NodeId

    def handshake_pair() -> tuple[SecureChannel, SecureChannel]:
        d_key, a_key = EphemeralKey(), EphemeralKey()
        dialer = hs.Identity(NodeId("d"), "trexo", 2, 1, b"s").hello((), d_key)
        acceptor = hs.Identity(NodeId("a"), "trexo", 2, 1, b"s").hello((), a_key)
        d_keys = hs.link_keys(b"s", d_key, dialer, acceptor, role=hs.DIALER)
        a_keys = hs.link_keys(b"s", a_key, dialer, acceptor, role=hs.ACCEPTOR)
        assert not isinstance(d_keys, hs.Refusal) and not isinstance(a_keys, hs.Refusal)
        return SecureChannel.for_dialer(d_keys), SecureChannel.for_acceptor(a_keys)

    out: dict[str, Any] = {"handshake_both_sides": per_op_us(handshake_pair, 200)}
    dialer, acceptor = handshake_pair()
    for size in SIZES:
        message = os.urandom(size)
        count = max(50, 200_000 // size)

        def round_trip(message: bytes = message) -> None:
            acceptor.opener.open(dialer.sealer.seal(message))

        cost = per_op_us(round_trip, count)
        cost["mb_per_s"] = size / cost["median_us"]
        out[f"seal+open {size} B"] = cost
    return out


# --- link-up, in a subprocess per tree ------------------------------------------------------------


async def measure_link_up(count: int) -> list[float]:
    """Seconds per `connect` between two fresh in-process transports (the tree on sys.path)."""
    from trexo.config import TransportConfig
    from trexo.net.router import Router
    from trexo.net.transport import Transport
    from trexo.types.ids import NodeId

    config = TransportConfig(host="127.0.0.1", port=0)
    times = []
    for i in range(count):
        async with trio.open_nursery() as nursery:
            a = Transport(Router(NodeId(f"a{i}")), config)
            b = Transport(Router(NodeId(f"b{i}")), config)
            port = await nursery.start(a.run)
            await nursery.start(b.run)
            started = time.perf_counter()
            await b.connect("127.0.0.1", port)
            times.append(time.perf_counter() - started)
            nursery.cancel_scope.cancel()
    return times


def link_up_in(tree: Path, count: int) -> list[float]:
    command = [sys.executable, __file__, "--measure-link-up", str(count)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(measured["trexo"]).resolve().is_relative_to(tree.resolve()), measured["trexo"]
    samples: list[float] = measured["samples"]
    return samples


# --- decode across a link, and failover: real processes of each tree ------------------------------


async def decode_through_a_link(tree: Path, root: Path, chats: int) -> dict[str, list[float]]:
    """TTFT and ms per token of greedy chats through node A, the model on node B."""
    env = {"PYTHONPATH": str(tree), "OPENBLAS_NUM_THREADS": "1"}
    ttft: list[float] = []
    per_token: list[float] = []
    async with open_cluster(root) as cluster:
        a = await cluster.add("--no-model", "-q", env=env)
        b = await cluster.add("--no-model", "-q", env=env)
        await cluster.wait_converged(expect_nodes=2)
        placed = await cluster.http.post(
            f"{a.url}/instances", json={"model": MODEL, "node_id": b.node_id}
        )
        assert placed.status_code == 201, placed.text
        client = openai.AsyncOpenAI(base_url=f"{a.url}/v1", api_key="x", max_retries=0)
        with trio.fail_after(120):
            while True:  # until the instance answers
                try:
                    await client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
                    )
                    break
                except openai.APIError:
                    await trio.sleep(0.1)
        for _ in range(chats):
            started = time.perf_counter()
            first = None
            tokens = 0
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=128,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter()
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            ended = time.perf_counter()
            assert first is not None and tokens > 1
            ttft.append(first - started)
            per_token.append((ended - first) / (tokens - 1))
    return {"ttft": ttft, "per_token": per_token}


async def failover_with(tree: Path, root: Path, trials: int) -> list[float]:
    """Seconds from the master's SIGKILL to a survivor's API answering a command (3 nodes)."""
    trace = root / "trace.jsonl"
    env = {"TREXO_TRACE_FILE": str(trace), "PYTHONPATH": str(tree)}
    samples = []
    async with open_cluster(root) as cluster, httpx.AsyncClient() as http:
        for _ in range(3):
            await cluster.add("--no-model", "-q", env=env)
        await cluster.wait_converged(expect_nodes=3)
        for _ in range(trials):
            samples.append((await trial(cluster, trace, signal.SIGKILL, http))["api_ready"])
    return samples


# --- the whole run -------------------------------------------------------------------------------


def unpack_baseline(ref: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def ratio_row(encrypted: list[float], plain: list[float], unit: str) -> dict[str, Any]:
    return {
        "encrypted": describe([v * 1e3 for v in encrypted], unit, 3),
        "plain": describe([v * 1e3 for v in plain], unit, 3),
        "ratio_of_medians": statistics.median(encrypted) / statistics.median(plain),
    }


async def main_async(args: argparse.Namespace) -> None:
    results: dict[str, Any] = {"baseline_ref": args.baseline_ref, "rounds": args.rounds}
    results["crypto"] = crypto_costs()
    for name, cost in results["crypto"].items():
        print(f"{name}: {cost['median_us']:.2f} µs", flush=True)
    with tempfile.TemporaryDirectory(prefix="trexo-bench-private-") as tmp:
        root = Path(tmp)
        trees = {"encrypted": ROOT, "plain": unpack_baseline(args.baseline_ref, root / "plain")}
        link_up: dict[str, list[float]] = {"encrypted": [], "plain": []}
        decode: dict[str, dict[str, list[float]]] = {
            name: {"ttft": [], "per_token": []} for name in trees
        }
        failover: dict[str, list[float]] = {"encrypted": [], "plain": []}
        for rnd in range(args.rounds):
            # Alternate which goes first: a drift of the machine's load hits both alike.
            order = list(trees) if rnd % 2 == 0 else list(reversed(trees))
            for name in order:
                tree = trees[name]
                link_up[name] += link_up_in(tree, args.link_ups)
                got = await decode_through_a_link(tree, root / f"decode-{name}-{rnd}", args.chats)
                for key, values in got.items():
                    decode[name][key] += values
                if args.failover_trials:
                    failover[name] += await failover_with(
                        tree, root / f"failover-{name}-{rnd}", args.failover_trials
                    )
                print(
                    f"round {rnd + 1} {name}: link-up "
                    f"{statistics.median(link_up[name]) * 1e3:.2f} ms, per token "
                    f"{statistics.median(decode[name]['per_token']) * 1e3:.2f} ms",
                    flush=True,
                )
    results["link_up"] = ratio_row(link_up["encrypted"], link_up["plain"], "ms")
    results["decode_per_token"] = ratio_row(
        decode["encrypted"]["per_token"], decode["plain"]["per_token"], "ms"
    )
    results["decode_ttft"] = ratio_row(decode["encrypted"]["ttft"], decode["plain"]["ttft"], "ms")
    if args.failover_trials:
        results["failover_api_ready"] = ratio_row(failover["encrypted"], failover["plain"], "ms")
    results["link_up_samples"] = {k: summarize(v) for k, v in link_up.items()}
    path = write_results("private_links", results)
    print(json.dumps({k: v for k, v in results.items() if k != "crypto"}, indent=1))
    print(f"written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-ref", default=BASELINE_REF, help="the plain-links commit")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds per tree")
    parser.add_argument("--link-ups", type=int, default=30, help="connects per round")
    parser.add_argument("--chats", type=int, default=5, help="chats per round")
    parser.add_argument(
        "--failover-trials", type=int, default=5, help="master kills per round (0: none)"
    )
    parser.add_argument("--measure-link-up", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_link_up is not None:  # the subprocess: one tree's link-ups, as JSON
        while str(ROOT) in sys.path:  # the tree to measure is the one on PYTHONPATH
            sys.path.remove(str(ROOT))
        sys.path.insert(0, os.environ["PYTHONPATH"])
        samples = trio.run(measure_link_up, args.measure_link_up)
        import trexo

        print(json.dumps({"trexo": trexo.__file__, "samples": samples}))
        return
    trio.run(main_async, args)


if __name__ == "__main__":
    main()
