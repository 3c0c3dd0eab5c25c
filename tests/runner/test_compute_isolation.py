"""One request's failure in a runner is that request's alone.

A real `ComputeThread` (a thread in this process, the tiny demo model) serves a hostile
request beside ordinary ones: bad sampler parameters, a chat template that raises on the
request's messages. The hostile request fails with its own error; the others finish as they
would have, see none of its text, and the thread goes on serving.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.waiting import NotYet, wait_until_sync
from trexo.runner import hooks
from trexo.runner.compute import ComputeThread
from trexo.types.chunks import Chunk
from trexo.types.failure import FailureKind
from trexo.types.generation import ChatMessage, GenerationRequest, SamplingParams
from trexo.types.ids import RequestId
from trexo.types.ipc import (
    ChunkBatch,
    ChunkMessage,
    FromRunner,
    LoadModel,
    RequestFailed,
    StatusReport,
)
from trexo.types.runner_status import RunnerFailed, RunnerReady

TIMEOUT_S = 60.0
"""Generous: catches hangs only."""
SLOW_STEPS = hooks.TestHooks(step_delay=0.02)
"""Slow enough that requests sent together surely share steps."""
MAX_TOKENS = 12
RAISES_ON_SYSTEM = (
    "{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""Gemma's way: a system turn is an error, raised from the template."""


class Posted:
    """What the compute thread posted, in order (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[FromRunner] = []

    def __call__(self, item: FromRunner) -> None:
        with self._lock:
            self.items.append(item)

    def snapshot(self) -> list[FromRunner]:
        with self._lock:
            return list(self.items)

    def chunks(self, rid: str) -> list[Chunk]:
        out: list[Chunk] = []
        for item in self.snapshot():
            if isinstance(item, ChunkMessage):
                out.append(item.chunk)
            elif isinstance(item, ChunkBatch):
                out.extend(item.chunks)
        return [c for c in out if c.request_id == rid]

    def failures(self) -> dict[RequestId, RequestFailed]:
        return {i.request_id: i for i in self.snapshot() if isinstance(i, RequestFailed)}

    def ended(self, rid: str) -> bool:
        done = any(c.finish_reason is not None for c in self.chunks(rid))
        return done or RequestId(rid) in self.failures()

    def status(self) -> list[object]:
        return [i.status for i in self.snapshot() if isinstance(i, StatusReport)]


@pytest.fixture
def hostile_template_model(tmp_path: Path, tiny_model: Path) -> Path:
    """The tiny model with a chat template that raises on a system turn."""
    model = tmp_path / "raises-on-system"
    shutil.copytree(tiny_model, model)
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = RAISES_ON_SYSTEM
    config_path.write_text(json.dumps(config))
    return model


def serving(model: Path, posted: Posted) -> Iterator[ComputeThread]:
    compute = ComputeThread(posted, SLOW_STEPS)
    compute.start()
    try:
        compute.submit_load(LoadModel(str(model)))
        wait_until_sync(
            lambda: (
                RunnerReady() in posted.status()
                or NotYet([s for s in posted.status() if isinstance(s, RunnerFailed)])
            ),
            timeout=TIMEOUT_S,
            what="the model loaded",
        )
        yield compute
    finally:
        compute.request_stop()
        assert compute.join(TIMEOUT_S)


@pytest.fixture
def tiny_compute(tiny_model: Path) -> Iterator[tuple[ComputeThread, Posted]]:
    posted = Posted()
    for compute in serving(tiny_model, posted):
        yield compute, posted


@pytest.fixture
def hostile_compute(hostile_template_model: Path) -> Iterator[tuple[ComputeThread, Posted]]:
    posted = Posted()
    for compute in serving(hostile_template_model, posted):
        yield compute, posted


def request(rid: str, *messages: ChatMessage, **params: object) -> GenerationRequest:
    turns = messages or (ChatMessage("user", "Tell me about the with statement."),)
    defaults: dict[str, object] = {"max_tokens": MAX_TOKENS}
    return GenerationRequest(
        RequestId(rid),
        messages=turns,
        params=SamplingParams(**(defaults | params)),  # type: ignore[arg-type]
    )


def wait_ended(posted: Posted, *rids: str) -> None:
    wait_until_sync(
        lambda: all(posted.ended(r) for r in rids) or NotYet(posted.snapshot()[-3:]),
        timeout=TIMEOUT_S,
        what=f"{rids} ended",
    )


def text_of(chunks: list[Chunk]) -> str:
    return "".join(c.text for c in chunks)


def test_top_k_beyond_the_vocabulary_fails_no_other_request(
    tiny_compute: tuple[ComputeThread, Posted],
) -> None:
    compute, posted = tiny_compute
    compute.submit_generate(request("ordinary"))
    compute.submit_generate(request("hostile", temperature=1.0, top_k=10**9))
    compute.submit_generate(request("after"))
    wait_ended(posted, "ordinary", "hostile", "after")
    failures = posted.failures()
    for rid in ("ordinary", "after"):
        assert RequestId(rid) not in failures
        assert posted.chunks(rid)[-1].finish_reason == "length"
    # The hostile request is served too: a top-k that keeps everything filters nothing.
    assert RequestId("hostile") not in failures
    assert posted.chunks("hostile")[-1].finish_reason == "length"


def test_a_template_that_raises_fails_its_request_alone(
    hostile_compute: tuple[ComputeThread, Posted],
) -> None:
    compute, posted = hostile_compute
    compute.submit_generate(request("ordinary", max_tokens=40))
    wait_until_sync(
        lambda: posted.chunks("ordinary") or NotYet(posted.snapshot()[-3:]),
        timeout=TIMEOUT_S,
        what="the ordinary stream started",
    )
    system = ChatMessage("system", "You are terse.")
    compute.submit_generate(request("hostile", system, ChatMessage("user", "hi")))
    wait_ended(posted, "ordinary", "hostile")
    failure = posted.failures()[RequestId("hostile")]
    assert failure.kind is FailureKind.INVALID_REQUEST
    assert "System role not supported" in failure.message
    assert RequestId("ordinary") not in posted.failures()
    assert posted.chunks("ordinary")[-1].finish_reason == "length"
    # The thread still serves.
    compute.submit_generate(request("after"))
    wait_ended(posted, "after")
    assert posted.chunks("after")[-1].finish_reason == "length"


def test_sampling_parameters_mlx_would_refuse_are_their_request_s_error(
    tiny_compute: tuple[ComputeThread, Posted],
) -> None:
    compute, posted = tiny_compute
    compute.submit_generate(request("ordinary"))
    compute.submit_generate(request("hostile", temperature=1.0, min_p=5.0))  # as a peer may
    wait_ended(posted, "ordinary", "hostile")
    failure = posted.failures()[RequestId("hostile")]
    assert failure.kind is FailureKind.INVALID_REQUEST
    assert "min_p" in failure.message
    assert posted.chunks("ordinary")[-1].finish_reason == "length"


def test_a_failed_step_tells_no_request_the_error_text(
    tiny_compute: tuple[ComputeThread, Posted], monkeypatch: pytest.MonkeyPatch
) -> None:
    compute, posted = tiny_compute
    from trexo.engine.batch import BatchEngine

    step = BatchEngine.step
    failed = False

    def failing_once(self: BatchEngine) -> list[Chunk]:
        nonlocal failed
        if len(self) == 2 and not failed:  # once both run
            failed = True
            raise ValueError("an attacker's text")
        return step(self)

    monkeypatch.setattr(BatchEngine, "step", failing_once)
    compute.submit_generate(request("a"))
    compute.submit_generate(request("b"))
    wait_ended(posted, "a", "b")
    failures = posted.failures()
    assert set(failures) == {RequestId("a"), RequestId("b")}
    assert not any("attacker" in f.message for f in failures.values())
    compute.submit_generate(request("after"))  # a fresh batch serves on
    wait_ended(posted, "after")
    assert posted.chunks("after")[-1].finish_reason == "length"
