"""Many users at once: trexo against `mlx_lm.server`, the peer a user would otherwise pick.

Both serve the same demo model files on this machine with one OpenBLAS thread (the server
gets Debian's OpenBLAS through `LD_PRELOAD`, as trexo's runners load it), and the same
client load is sent to each, interleaved round by round:

- load: `c` simultaneous streamed chats (c = 1, 4, 8, 16; each prompt made distinct so that
  no prompt cache helps), `max_tokens` greedy tokens each. Recorded: aggregate tokens per
  second (all completion tokens over the wall time), each stream's time to first token,
  and, for trexo, the node process's CPU time per streamed token (the runner's is not
  counted: it is the model's work).
- the second turn of a conversation whose history is ~900 tokens: its time to first token
  cold (a history the server never saw) and cached (the first turn was just served, so a
  prompt cache holds it).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import attrs
import openai
import psutil
import trio

CONCURRENCY = (1, 4, 8, 16)
SERVER_START_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 300.0
HISTORY_TOPIC = "compound"
"""The `pydoc_data.topics` entry whose text makes the first turn's long message."""
HISTORY_CHARS = 3200
"""About 900 tokens of the demo tokenizer once templated."""
FIRST_TURN_TOKENS = 32
SECOND_TURN_TOKENS = 8
QUESTIONS = (
    "Tell me about Python's with statement.",
    "What does the yield statement do?",
    "Explain how decorators work.",
    "What is a generator expression?",
)


@attrs.frozen
class Server:
    name: str
    url: str
    model: str
    node_pid: int | None = None
    """trexo's node process (its CPU is counted); None for mlx_lm.server."""

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S
        )


@attrs.frozen
class LoadRun:
    wall_s: float
    tokens: int
    ttfts_s: tuple[float, ...]
    node_cpu_s: float | None

    @property
    def throughput(self) -> float:
        return self.tokens / self.wall_s


@asynccontextmanager
async def mlx_lm_server(
    model_dir: Path, log_path: Path, blas_path: str | None
) -> AsyncIterator[Server]:
    """`python -m mlx_lm.server` on a free loopback port, ready; always stopped."""
    port = _free_port()
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    if blas_path:
        env["LD_PRELOAD"] = blas_path
    command = [
        sys.executable,
        *("-m", "mlx_lm.server", "--model", str(model_dir)),
        *("--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING"),
    ]
    with log_path.open("wb") as log:
        process = await trio.lowlevel.open_process(
            command, stdout=log, stderr=log, env=env, start_new_session=True
        )
        try:
            server = Server("mlx_lm.server", f"http://127.0.0.1:{port}", str(model_dir))
            await _wait_serving(server, process)
            yield server
        finally:
            with trio.CancelScope(shield=True):
                process.terminate()
                with trio.move_on_after(10):
                    await process.wait()
                with suppress(ProcessLookupError):
                    process.kill()
                await process.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _wait_serving(server: Server, process: trio.Process) -> None:
    client = server.client()
    with trio.fail_after(SERVER_START_TIMEOUT_S):
        while True:
            if process.returncode is not None:
                raise RuntimeError(f"{server.name} exited with {process.returncode}")
            try:
                await client.chat.completions.create(
                    model=server.model,
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=1,
                )
                return
            except (openai.APIConnectionError, openai.APIStatusError):
                await trio.sleep(0.2)


RESETS: dict[str, int] = {}
"""Requests a server reset before its first token, per server (retried; counted)."""
MAX_ATTEMPTS = 3


async def stream(
    server: Server, messages: list[dict[str, str]], max_tokens: int
) -> tuple[float, int]:
    """One streamed chat: seconds to the first content token (from the first attempt),
    completion tokens. A connection reset before the first token is retried (mlx_lm.server's
    listen backlog of 5 resets some of 16 simultaneous connections) and counted."""
    client = server.client()
    t0 = time.perf_counter()
    for attempt in range(MAX_ATTEMPTS):
        first = 0.0
        tokens = 0
        try:
            response = await client.chat.completions.create(
                model=server.model,
                messages=messages,  # type: ignore[arg-type]
                max_tokens=max_tokens,
                temperature=0.0,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in response:
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
                if chunk.choices and chunk.choices[0].delta.content and not first:
                    first = time.perf_counter() - t0
            return first, tokens
        except openai.APIConnectionError:
            if first or attempt == MAX_ATTEMPTS - 1:
                raise
            RESETS[server.name] = RESETS.get(server.name, 0) + 1
    raise AssertionError("unreachable")


def _distinct(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{uuid.uuid4().hex[:8]}: {question}"}]


async def load_run(server: Server, concurrency: int, max_tokens: int) -> LoadRun:
    results: list[tuple[float, int]] = []
    node = psutil.Process(server.node_pid) if server.node_pid else None
    cpu_before = _cpu(node)

    async def one(k: int) -> None:
        results.append(await stream(server, _distinct(QUESTIONS[k % len(QUESTIONS)]), max_tokens))

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for k in range(concurrency):
            nursery.start_soon(one, k)
    wall = time.perf_counter() - t0
    node_cpu = _cpu(node) - cpu_before if node is not None else None
    return LoadRun(wall, sum(t for _, t in results), tuple(f for f, _ in results), node_cpu)


def _cpu(process: psutil.Process | None) -> float:
    if process is None:
        return 0.0
    times = process.cpu_times()
    return float(times.user + times.system)


def history_text() -> str:
    from pydoc_data.topics import topics

    return topics[HISTORY_TOPIC][:HISTORY_CHARS]


async def second_turn(server: Server, *, cached: bool) -> float:
    """Time to the first token of a conversation's second turn with a ~900-token history:
    its first turn served just before (`cached`), or never (cold)."""
    first_message = f"{uuid.uuid4().hex} {history_text()}"
    first = [{"role": "user", "content": first_message}]
    answer = "I see."
    if cached:
        reply = await server.client().chat.completions.create(
            model=server.model,
            messages=first,  # type: ignore[arg-type]
            max_tokens=FIRST_TURN_TOKENS,
            temperature=0.0,
        )
        answer = reply.choices[0].message.content or answer
    turn = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "Why?"}]
    ttft, _ = await stream(server, turn, SECOND_TURN_TOKENS)
    return ttft


@attrs.define
class LoadSamples:
    load: dict[str, dict[int, list[LoadRun]]] = attrs.Factory(dict)
    turns: dict[str, dict[str, list[float]]] = attrs.Factory(dict)


async def measure_load(
    servers: Sequence[Server], rounds: int, max_tokens: int, samples: LoadSamples
) -> None:
    """Interleaved rounds: every concurrency on every server, the server order alternating."""
    for server in servers:  # warm each path once
        await load_run(server, 2, 8)
        await second_turn(server, cached=True)
    for r in range(rounds):
        order = list(servers) if r % 2 == 0 else list(reversed(servers))
        for concurrency in CONCURRENCY:
            for server in order:
                run = await load_run(server, concurrency, max_tokens)
                samples.load.setdefault(server.name, {}).setdefault(concurrency, []).append(run)
                print(
                    f"round {r + 1}, {concurrency} streams, {server.name}: "
                    f"{run.throughput:.0f} tok/s, first token median "
                    f"{statistics.median(run.ttfts_s) * 1e3:.0f} ms",
                    flush=True,
                )
        for server in order:
            for cached in (False, True):
                ttft = await second_turn(server, cached=cached)
                kind = "cached" if cached else "cold"
                samples.turns.setdefault(server.name, {}).setdefault(kind, []).append(ttft)
            turns = samples.turns[server.name]
            print(
                f"round {r + 1}, second turn, {server.name}: cold "
                f"{turns['cold'][-1] * 1e3:.0f} ms, cached {turns['cached'][-1] * 1e3:.0f} ms",
                flush=True,
            )


def _p90(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def summarize(samples: LoadSamples) -> dict[str, Any]:
    """Per server and concurrency: aggregate tok/s and TTFT (median, p90) over all streams
    of all rounds; trexo's node CPU per streamed token; second-turn TTFTs."""
    out: dict[str, Any] = {"load": {}, "turns": {}, "connection_resets_retried": dict(RESETS)}
    for name, by_concurrency in samples.load.items():
        for concurrency, runs in by_concurrency.items():
            ttfts = [t for run in runs for t in run.ttfts_s]
            row: dict[str, Any] = {
                "aggregate_tok_s": statistics.median(r.throughput for r in runs),
                "ttft_median_ms": statistics.median(ttfts) * 1e3,
                "ttft_p90_ms": _p90(ttfts) * 1e3,
                "runs": len(runs),
            }
            cpu = [r.node_cpu_s / r.tokens for r in runs if r.node_cpu_s is not None and r.tokens]
            if cpu:
                row["node_cpu_ms_per_token"] = statistics.median(cpu) * 1e3
            out["load"].setdefault(name, {})[concurrency] = row
    for name, kinds in samples.turns.items():
        cold, cached = kinds["cold"], kinds["cached"]
        out["turns"][name] = {
            "cold_ms": statistics.median(cold) * 1e3,
            "cached_ms": statistics.median(cached) * 1e3,
            "speedup": statistics.median(c / k for c, k in zip(cold, cached, strict=True)),
        }
    return out


def markdown(summary: dict[str, Any]) -> str:
    names = list(summary["load"])
    lines = [
        "| streams | " + " | ".join(f"{n}: tok/s, TTFT median / p90" for n in names) + " |",
        "|---:|" + "---:|" * len(names),
    ]
    for concurrency in CONCURRENCY:
        cells = []
        for name in names:
            row = summary["load"][name][concurrency]
            cell = (
                f"{row['aggregate_tok_s']:.0f}, {row['ttft_median_ms']:.0f} / "
                f"{row['ttft_p90_ms']:.0f} ms"
            )
            if "node_cpu_ms_per_token" in row:
                cell += f" (node CPU {row['node_cpu_ms_per_token']:.2f} ms/token)"
            cells.append(cell)
        lines.append(f"| {concurrency} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| second turn, ~900-token history | cold | cached | speed-up |")
    lines.append("|---|---:|---:|---:|")
    for name, row in summary["turns"].items():
        lines.append(
            f"| {name} | {row['cold_ms']:.0f} ms | {row['cached_ms']:.0f} ms | "
            f"{row['speedup']:.1f}x |"
        )
    return "\n".join(lines)


def plot(summary: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install -e '.[bench]')")
        return
    fig, (rate, ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, rows in summary["load"].items():
        xs = sorted(rows, key=int)
        rate.plot(xs, [rows[x]["aggregate_tok_s"] for x in xs], marker="o", label=name)
        ttft.plot(xs, [rows[x]["ttft_median_ms"] for x in xs], marker="o", label=f"{name} median")
        ttft.plot(xs, [rows[x]["ttft_p90_ms"] for x in xs], linestyle=":", label=f"{name} p90")
    rate.set_xlabel("simultaneous streams")
    rate.set_ylabel("aggregate tokens/s")
    rate.set_title("throughput")
    rate.legend(fontsize=8)
    ttft.set_xlabel("simultaneous streams")
    ttft.set_ylabel("time to first token, ms")
    ttft.set_yscale("log")
    ttft.set_title("per-stream TTFT")
    ttft.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")
