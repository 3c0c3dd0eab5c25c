"""Helpers for tests that run real runner processes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from trexo.config import RunnerConfig
from trexo.types.chunks import Chunk
from trexo.types.generation import ChatMessage, GenerationRequest, SamplingParams
from trexo.types.ids import RequestId, new_id
from trexo.worker.runner_supervisor import RunnerSupervisor

TEST_TIMEOUT_S = 60.0
"""Generous: catches hangs only. Speed is measured in bench/."""
FAST_STOP = RunnerConfig(shutdown_grace=0.5, term_grace=0.5, kill_grace=5.0)


def chat_request(
    text: str = "Tell me about the with statement.",
    *,
    request_id: str | None = None,
    **params: object,
) -> GenerationRequest:
    return GenerationRequest(
        RequestId(request_id or new_id()),
        messages=(ChatMessage("user", text),),
        params=SamplingParams(**params),  # type: ignore[arg-type]
    )


@asynccontextmanager
async def running_supervisor(
    tmp_path: Path,
    *,
    config: RunnerConfig = FAST_STOP,
    env: dict[str, str] | None = None,
) -> AsyncIterator[RunnerSupervisor]:
    """A started supervisor; stopped (and its process reaped) when the block exits."""
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            supervisor = RunnerSupervisor(
                "test-runner", config=config, log_dir=tmp_path / "logs", env=env
            )
            await nursery.start(supervisor.run)
            yield supervisor
            nursery.cancel_scope.cancel()


async def collect(supervisor: RunnerSupervisor, request: GenerationRequest) -> list[Chunk]:
    async with supervisor.open_generation(request) as stream:
        return [chunk async for chunk in stream]


def in_process_greedy_tokens(model_dir: Path, text: str, max_tokens: int) -> list[int]:
    """The unsharded model's greedy tokens, straight from mlx-lm."""
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = mlx_lm.load(str(model_dir))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    return [
        response.token
        for response in mlx_lm.stream_generate(
            model, tokenizer, prompt, max_tokens=max_tokens, sampler=make_sampler(temp=0.0)
        )
    ]
