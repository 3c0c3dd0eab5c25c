"""Serving overhead: the same greedy chat request in-process with mlx-lm and through `trexo run`.

- baseline: `mlx_lm.stream_generate` on the demo model, loaded once in this process, with the
  chat-templated prompt and a greedy sampler;
- trexo: one real `trexo run --demo-size SIZE --api-port 0` node (its own temporary data dir,
  the same model files), streamed with the official `openai` async client.

Both sides report time to first token (the call / the request sent, until the first token's
text) and the decode rate (tokens after the first over the time after the first; for trexo the
token count is the stream's `usage.completion_tokens`). Trials interleave the two, alternating
which goes first; the table shows medians and the per-trial ratios / differences.

CPU per request (user + system, all threads, 10 ms ticks) is counted for this process during
the baseline, and for the runner, the node and this process (the client) during trexo's.

Aggregate throughput through trexo is total completion tokens over wall time with 1 and with
`--concurrency` simultaneous streams. The runner serves one generation at a time today (no
batching), so the aggregate stays about the single-stream rate and the later streams wait:
the slowest stream's TTFT is about (concurrency - 1) generations.

Everything runs with one OpenBLAS thread, as runners do. Run: `nox -s bench-serving`
(or `python bench/bench_serving.py --trials 21 --max-tokens 128 --size small`).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import attrs
import openai
import psutil
import trio
from openai.types.chat import ChatCompletionUserMessageParam

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import prefill_stall, serving_load
from bench.stats import RESULTS_DIR, describe, markdown_value_table, write_results
from trexo.engine.blas import setup_blas
from trexo.engine.demo_model import DEMO_MODEL_NAMES, demo_model_name, ensure_demo_model

ROOT = Path(__file__).resolve().parents[1]
TREXO_RUN = (sys.executable, "-m", "trexo", "run")
DEFAULT_TRIALS = 21
DEFAULT_MAX_TOKENS = 128
DEFAULT_SIZE = "small"
DEFAULT_CONCURRENCY = 4
DEFAULT_AGGREGATE_ROUNDS = 5
DEFAULT_LOAD_ROUNDS = 3
BLAS_THREADS = 1
"""What runners use (`RunnerConfig.openblas_threads`): the baseline must not get more."""

MESSAGES: list[ChatCompletionUserMessageParam] = [
    {"role": "user", "content": "Tell me about Python's with statement."}
]
"""Greedy decoding of this prompt runs the small and tiny demo models to max_tokens, no EOS."""

NODE_ISOLATION: tuple[tuple[str, ...], ...] = (
    ("--peer-host", "127.0.0.1"),
    ("--peer-port", "0"),
    ("--no-multicast",),
    ("--namespace", f"trexo-bench-serving-{os.getpid()}"),
)
"""Passed where this checkout's `trexo run` has them: the node must neither join nor take in
another node on this machine or LAN (a test's, say), nor fail on a peer port in use."""

START_TIMEOUT_S = 120.0
READY_POLL_S = 0.05
STOP_TIMEOUT_S = 15.0
REQUEST_TIMEOUT_S = 120.0
READY_PREFIX = "trexo is ready"
URL = re.compile(r"https?://[^\s/]+")
MS_PER_S = 1e3
MIN_CONCURRENCY = 2
MIN_MAX_TOKENS = 2
"""A decode rate needs tokens after the first; an aggregate comparison needs two streams."""
LOG_TAIL_CHARS = 4000


class NodeFailed(RuntimeError):
    """The `trexo run` node did not become ready."""


# --- measurements --------------------------------------------------------------------------


@attrs.frozen
class StreamTiming:
    """One streamed generation, timed from the call (or the request sent)."""

    first_token_s: float
    """Until the first token's text arrived."""
    last_token_s: float
    """Until the last token arrived (for trexo: the chunk with the finish reason)."""
    end_s: float
    """Until the call returned (the stream closed)."""
    completion_tokens: int
    text: str
    cpu_s: Mapping[str, float] = attrs.field(factory=dict)
    """CPU seconds each process (group) used during the generation."""

    @property
    def decode_rate(self) -> float:
        """Tokens after the first, per second after the first."""
        return (self.completion_tokens - 1) / (self.last_token_s - self.first_token_s)


@attrs.frozen
class AggregateRun:
    """Simultaneous streams: how long they all took and what each saw."""

    wall_s: float
    streams: tuple[StreamTiming, ...]

    @property
    def throughput(self) -> float:
        return sum(s.completion_tokens for s in self.streams) / self.wall_s

    @property
    def slowest_first_token_s(self) -> float:
        return max(s.first_token_s for s in self.streams)


@attrs.define
class Samples:
    """Everything measured, one list per quantity; pairs share an index."""

    baseline: list[StreamTiming] = attrs.Factory(list)
    trexo: list[StreamTiming] = attrs.Factory(list)
    baseline_single: list[StreamTiming] = attrs.Factory(list)
    aggregate: dict[int, list[AggregateRun]] = attrs.Factory(dict)


@attrs.frozen
class CpuMeter:
    """CPU seconds (user + system, all threads) used by named groups of processes."""

    groups: Mapping[str, Sequence[psutil.Process]]

    def read(self) -> dict[str, float]:
        return {name: sum(map(_cpu_s, group)) for name, group in self.groups.items()}

    def since(self, before: Mapping[str, float]) -> dict[str, float]:
        return {name: now - before[name] for name, now in self.read().items()}


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


# --- baseline: mlx-lm in this process ------------------------------------------------------


class Baseline:
    """The model loaded once with mlx-lm, generating like the runner's engine does."""

    def __init__(self, model_dir: Path) -> None:
        # Imported here: `setup_blas` must have run before anything imports mlx.
        from mlx_lm.utils import load_model, load_tokenizer

        self._model, config = load_model(model_dir)
        self._tokenizer = load_tokenizer(  # type: ignore[no-untyped-call]
            model_dir, eos_token_ids=config.get("eos_token_id")
        )
        self.prompt_tokens = len(self._encode())

    def _encode(self) -> list[int]:
        return list(self._tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True))

    def generate(self, max_tokens: int) -> StreamTiming:
        """Timed from the messages, as trexo starts from them (templating takes ~0.05 ms)."""
        import mlx.core as mx
        from mlx_lm.generate import stream_generate
        from mlx_lm.sample_utils import make_sampler

        text = ""
        tokens = 0
        first = last = 0.0
        t0 = time.perf_counter()
        responses = stream_generate(
            self._model,
            self._tokenizer,
            mx.array(self._encode()),
            max_tokens=max_tokens,
            sampler=make_sampler(temp=0.0),
        )
        for response in responses:
            now = time.perf_counter() - t0
            tokens = response.generation_tokens
            last = now
            if response.text and not text:
                first = now
            text += response.text
        end = time.perf_counter() - t0
        if not text:
            raise RuntimeError("mlx-lm generated no text")
        return StreamTiming(first, last, end, tokens, text)


# --- trexo: a real node, streamed with the openai client -----------------------------------


@attrs.frozen
class ServingNode:
    """A started `trexo run`: its API URL and process id."""

    url: str
    pid: int

    def cpu_meter(self) -> CpuMeter:
        """Runners (the node's descendants), the node, and this process (the client)."""
        node = psutil.Process(self.pid)
        client = psutil.Process()
        return CpuMeter(
            {"runner": node.children(recursive=True), "node": [node], "client": [client]}
        )


def isolation_args() -> list[str]:
    """The `NODE_ISOLATION` options this checkout's `trexo run --help` lists."""
    usage = subprocess.run(
        [*TREXO_RUN, "--help"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    return [arg for option in NODE_ISOLATION if option[0] in usage for arg in option]


@asynccontextmanager
async def serving_node(data_dir: Path, size: str) -> AsyncIterator[ServingNode]:
    """Start `trexo run` in its own process group; yield it once ready; always stop it all.

    Its stdout goes to a file (read for the ready line): a pipe nobody drains could block it.
    """
    command = [
        *TREXO_RUN,
        *("--api-port", "0", "--data-dir", str(data_dir), "--demo-size", size),
        *isolation_args(),
    ]
    stdout_path = data_dir / "stdout.log"
    with stdout_path.open("wb") as stdout, (data_dir / "node.log").open("wb") as stderr:
        # cwd: `python -m trexo` then runs this checkout's trexo, as this process imports it.
        process = await trio.lowlevel.open_process(
            command, stdout=stdout, stderr=stderr, cwd=ROOT, start_new_session=True
        )
        try:
            yield ServingNode(await _wait_ready(process, data_dir), process.pid)
        finally:
            with trio.CancelScope(shield=True):
                await _stop(process)


async def _wait_ready(process: trio.Process, data_dir: Path) -> str:
    """The URL on the node's ready line; `NodeFailed` if it exits or takes too long first."""
    with trio.move_on_after(START_TIMEOUT_S):
        while process.poll() is None:
            for line in (data_dir / "stdout.log").read_text(errors="replace").splitlines():
                if line.startswith(READY_PREFIX) and (match := URL.search(line)):
                    return match.group(0)
            await trio.sleep(READY_POLL_S)
    log_tail = (data_dir / "node.log").read_text(errors="replace")[-LOG_TAIL_CHARS:]
    state = "still starting" if process.returncode is None else f"exit {process.returncode}"
    raise NodeFailed(f"trexo run was not ready ({state}); the end of its log:\n{log_tail}")


async def _stop(process: trio.Process) -> None:
    """SIGTERM the node, wait (bounded), then SIGKILL its whole process group (runners too)."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(STOP_TIMEOUT_S):
            await process.wait()
    # The group is the node's session (start_new_session): it holds every runner it spawned.
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()


async def stream_chat(client: openai.AsyncOpenAI, model: str, max_tokens: int) -> StreamTiming:
    """One streamed request; times are from just before the request is sent."""
    text = ""
    first = last = 0.0
    completion_tokens = 0
    t0 = time.perf_counter()
    stream = await client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=max_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        now = time.perf_counter() - t0
        if chunk.usage is not None:
            completion_tokens = chunk.usage.completion_tokens
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        if choice.delta.content:
            if not text:
                first = now
            text += choice.delta.content
        if choice.finish_reason is not None:
            last = now
    end = time.perf_counter() - t0
    if completion_tokens == 0 or not text:
        raise RuntimeError("the stream reported no usage or carried no text")
    return StreamTiming(first, last, end, completion_tokens, text)


async def aggregate_run(
    client: openai.AsyncOpenAI, model: str, max_tokens: int, concurrency: int
) -> AggregateRun:
    streams: list[StreamTiming] = []

    async def one() -> None:
        streams.append(await stream_chat(client, model, max_tokens))

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(one)
    return AggregateRun(time.perf_counter() - t0, tuple(streams))


# --- the run -------------------------------------------------------------------------------


@attrs.frozen
class Settings:
    trials: int
    max_tokens: int
    size: str
    concurrency: int
    aggregate_rounds: int
    load_rounds: int = DEFAULT_LOAD_ROUNDS
    only_load: bool = False
    blas_path: str | None = None


async def measure(
    settings: Settings, baseline: Baseline, data_dir: Path, load: serving_load.LoadSamples
) -> Samples:
    """Interleaved trials, then aggregate rounds, against one node; then the load against
    it and `mlx_lm.server` (`bench/serving_load.py`)."""
    samples = Samples()
    model = demo_model_name(settings.size)
    async with serving_node(data_dir, settings.size) as node:
        if not settings.only_load:
            await measure_node(settings, baseline, node, samples)
        model_dir = data_dir / "models" / model
        log_path = data_dir / "mlx_lm_server.log"
        async with serving_load.mlx_lm_server(model_dir, log_path, settings.blas_path) as peer:
            trexo = serving_load.Server("trexo", node.url, model, node.pid)
            await serving_load.measure_load(
                [trexo, peer], settings.load_rounds, settings.max_tokens, load
            )
    return samples


async def measure_node(
    settings: Settings, baseline: Baseline, node: ServingNode, samples: Samples
) -> None:
    """Interleaved trials against in-process mlx-lm, then aggregate rounds."""
    model = demo_model_name(settings.size)
    max_tokens = settings.max_tokens
    client = openai.AsyncOpenAI(
        base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S
    )
    baseline_meter = CpuMeter({"mlx-lm": [psutil.Process()]})
    trexo_meter = node.cpu_meter()

    def run_baseline() -> StreamTiming:
        # It blocks the event loop on purpose: nothing else is running meanwhile.
        before = baseline_meter.read()
        timing = baseline.generate(max_tokens)
        return attrs.evolve(timing, cpu_s=baseline_meter.since(before))

    async def run_trexo() -> StreamTiming:
        before = trexo_meter.read()
        timing = await stream_chat(client, model, max_tokens)
        return attrs.evolve(timing, cpu_s=trexo_meter.since(before))

    # Warm both: the first use of a code path pays for allocation and imports.
    run_baseline()
    await run_trexo()
    for i in range(settings.trials):
        if i % 2 == 0:
            samples.baseline.append(run_baseline())
            samples.trexo.append(await run_trexo())
        else:
            samples.trexo.append(await run_trexo())
            samples.baseline.append(run_baseline())
        _print_trial(i, samples.baseline[-1], samples.trexo[-1])
    for i in range(settings.aggregate_rounds):
        samples.baseline_single.append(run_baseline())
        for concurrency in (1, settings.concurrency):
            run = await aggregate_run(client, model, max_tokens, concurrency)
            samples.aggregate.setdefault(concurrency, []).append(run)
        _print_round(i, samples, settings.concurrency)


def _print_trial(i: int, base: StreamTiming, served: StreamTiming) -> None:
    print(
        f"trial {i + 1}: baseline ttft {base.first_token_s * MS_PER_S:.1f} ms,"
        f" {base.decode_rate:.1f} tok/s ({base.completion_tokens} tokens);"
        f" trexo ttft {served.first_token_s * MS_PER_S:.1f} ms,"
        f" {served.decode_rate:.1f} tok/s ({served.completion_tokens} tokens)"
    )


def _print_round(i: int, samples: Samples, concurrency: int) -> None:
    single = samples.aggregate[1][-1]
    many = samples.aggregate[concurrency][-1]
    print(
        f"aggregate round {i + 1}: concurrency 1 {single.throughput:.1f} tok/s,"
        f" concurrency {concurrency} {many.throughput:.1f} tok/s"
        f" (slowest first token {many.slowest_first_token_s * MS_PER_S:.0f} ms)"
    )


def _ms(values: Sequence[float]) -> dict[str, Any]:
    return describe([v * MS_PER_S for v in values], "ms")


def _cpu_rows(prefix: str, timings: Sequence[StreamTiming]) -> dict[str, dict[str, Any]]:
    """One row per process group: CPU milliseconds per request (all threads)."""
    return {f"{prefix}: {name}": _ms([t.cpu_s[name] for t in timings]) for name in timings[0].cpu_s}


def summarize_samples(samples: Samples, concurrency: int) -> dict[str, dict[str, Any]]:
    """The table's rows: medians of each side and of the per-trial comparisons."""
    base, served = samples.baseline, samples.trexo
    ttft_overhead = [t.first_token_s - b.first_token_s for b, t in zip(base, served, strict=True)]
    rate_ratio = [t.decode_rate / b.decode_rate for b, t in zip(base, served, strict=True)]
    single = samples.aggregate[1]
    many = samples.aggregate[concurrency]
    return {
        "TTFT, mlx-lm in-process": _ms([b.first_token_s for b in base]),
        "TTFT, trexo (openai client)": _ms([t.first_token_s for t in served]),
        "TTFT overhead, trexo - mlx-lm (per trial)": _ms(ttft_overhead),
        "decode, mlx-lm in-process": describe([b.decode_rate for b in base], "tok/s"),
        "decode, trexo": describe([t.decode_rate for t in served], "tok/s"),
        "decode ratio, trexo / mlx-lm (per trial)": describe(rate_ratio, "", digits=3),
        **_cpu_rows("CPU per request, in-process", base),
        **_cpu_rows("CPU per request, trexo", served),
        "aggregate, mlx-lm in-process, 1 request": describe(
            [b.completion_tokens / b.end_s for b in samples.baseline_single], "tok/s"
        ),
        "aggregate, trexo, 1 stream": describe([r.throughput for r in single], "tok/s"),
        f"aggregate, trexo, {concurrency} streams": describe([r.throughput for r in many], "tok/s"),
        f"aggregate ratio, {concurrency} streams / 1 (per round)": describe(
            [m.throughput / s.throughput for s, m in zip(single, many, strict=True)], "", digits=3
        ),
        f"slowest TTFT of {concurrency} streams": _ms([r.slowest_first_token_s for r in many]),
    }


def check_outputs(samples: Samples) -> dict[str, Any]:
    """Both sides must generate the same tokens for the comparison to be fair."""
    counts = {
        "baseline": sorted({b.completion_tokens for b in samples.baseline}),
        "trexo": sorted({t.completion_tokens for t in samples.trexo}),
    }
    texts = {b.text for b in samples.baseline} | {t.text for t in samples.trexo}
    same = len(texts) == 1 and counts["baseline"] == counts["trexo"]
    if not same:
        print(f"WARNING: the two sides generated different outputs: token counts {counts}")
    return {"completion_tokens": counts, "identical_text": len(texts) == 1, "fair": same}


def raw_samples(samples: Samples) -> dict[str, Any]:
    """Per-trial and per-round values, for a look beyond the medians."""

    def timing(t: StreamTiming) -> dict[str, Any]:
        cpu_ms = {name: seconds * MS_PER_S for name, seconds in t.cpu_s.items()}
        return {
            "ttft_ms": t.first_token_s * MS_PER_S,
            "decode_tok_s": t.decode_rate,
            "cpu_ms": cpu_ms,
        }

    return {
        "trials": [
            {"baseline": timing(b), "trexo": timing(t)}
            for b, t in zip(samples.baseline, samples.trexo, strict=True)
        ],
        "aggregate": {
            str(concurrency): [
                {
                    "throughput_tok_s": run.throughput,
                    "ttft_ms": sorted(s.first_token_s * MS_PER_S for s in run.streams),
                }
                for run in runs
            ]
            for concurrency, runs in samples.aggregate.items()
        },
    }


def source_revision() -> str | None:
    """`git describe` of the checkout measured ("-dirty" with uncommitted edits), if any."""
    try:
        described = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return described.stdout.strip()


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--trials", type=_positive, default=DEFAULT_TRIALS)
    parser.add_argument(
        "--max-tokens", type=_positive, default=DEFAULT_MAX_TOKENS, help="per request"
    )
    parser.add_argument("--size", choices=DEMO_MODEL_NAMES, default=DEFAULT_SIZE)
    parser.add_argument(
        "--concurrency", type=_positive, default=DEFAULT_CONCURRENCY, help="streams at once"
    )
    parser.add_argument("--aggregate-rounds", type=_positive, default=DEFAULT_AGGREGATE_ROUNDS)
    parser.add_argument(
        "--load-rounds",
        type=_positive,
        default=DEFAULT_LOAD_ROUNDS,
        help="rounds of the load against trexo and mlx_lm.server",
    )
    parser.add_argument(
        "--only-load", action="store_true", help="measure only the load against mlx_lm.server"
    )
    args = parser.parse_args(argv)
    if args.concurrency < MIN_CONCURRENCY:
        parser.error(f"--concurrency must be at least {MIN_CONCURRENCY}")
    if args.max_tokens < MIN_MAX_TOKENS:
        parser.error(f"--max-tokens must be at least {MIN_MAX_TOKENS}")
    return Settings(
        args.trials,
        args.max_tokens,
        args.size,
        args.concurrency,
        args.aggregate_rounds,
        args.load_rounds,
        args.only_load,
    )


def report(
    settings: Settings,
    baseline: Baseline,
    samples: Samples,
    load: serving_load.LoadSamples,
    **extra: Any,
) -> None:
    """Write `bench/results/serving.json` (and `serving_load.png`) and print the tables."""
    model = demo_model_name(settings.size)
    load_summary = serving_load.summarize(load)
    payload: dict[str, Any] = {
        "settings": attrs.asdict(settings),
        "model": model,
        "prompt_tokens": baseline.prompt_tokens,
        "blas_threads": BLAS_THREADS,
        "node_options": isolation_args(),
        **extra,
        "load": load_summary,
    }
    if not settings.only_load:
        rows = summarize_samples(samples, settings.concurrency)
        payload |= {"outputs": check_outputs(samples), "results": rows}
        payload["samples"] = raw_samples(samples)
    path = write_results("serving", payload)
    if not settings.only_load:
        outputs = payload["outputs"]
        print(
            f"\n{model}, {baseline.prompt_tokens} prompt tokens,"
            f" {outputs['completion_tokens']['trexo']} completion tokens per request (greedy),"
            f" {settings.trials} interleaved trials, {settings.aggregate_rounds} aggregate rounds\n"
        )
        print(markdown_value_table(payload["results"]))
    print(f"\n{model}, {settings.max_tokens} tokens per stream, {settings.load_rounds} rounds\n")
    print(serving_load.markdown(load_summary))
    print(f"written to {path}")
    serving_load.plot(load_summary, RESULTS_DIR / "serving_load.png")


def main() -> None:
    settings = parse_args()
    blas = setup_blas(threads=BLAS_THREADS)
    settings = attrs.evolve(settings, blas_path=blas)
    started = time.perf_counter()
    load_before = os.getloadavg()
    load = serving_load.LoadSamples()
    with tempfile.TemporaryDirectory(prefix="trexo-bench-serving-") as tmp:
        data_dir = Path(tmp) / "node"
        # The node's own models dir: it finds the model built and serves the same files.
        model_dir = ensure_demo_model(data_dir / "models", settings.size)
        baseline = Baseline(model_dir)
        stall = prefill_stall.measure(model_dir)
        print(f"prefill stall: {stall}")
        try:
            samples = trio.run(measure, settings, baseline, data_dir, load)
        except NodeFailed as exc:
            sys.exit(f"bench-serving: {exc}")
    report(
        settings,
        baseline,
        samples,
        load,
        blas=blas,
        revision=source_revision(),
        prefill_stall=stall,
        duration_s=time.perf_counter() - started,
        # The machine is shared: a busy one slows the three-process path more than one process.
        load_average={"before": load_before, "after": os.getloadavg()},
    )


if __name__ == "__main__":
    main()
