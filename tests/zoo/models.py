"""The model zoo for tests (`trexo.engine.zoo`): a factory that builds each architecture once
per session, and the greedy reference every test of a zoo model compares with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from trexo.engine.zoo import ensure_zoo_model

LONG_QUESTION = (
    "Explain, in a few short sentences, what the with statement does in Python and why "
    "context managers make the cleanup of files and locks reliable."
)
"""Chat-templated, longer than every sliding window of the zoo (`test_zoo` checks it)."""
BATCH_QUESTIONS = (LONG_QUESTION, "What is a generator?", "Hi", "Tell me about decorators.")
"""Four requests of different lengths, for the tests that batch them."""
QUANTIZED_ARCHS = ("llama", "qwen3_moe", "gemma3_text", "deepseek_v3")
"""The 4-bit variants the tests build: dense, mixture of experts, sliding window, MLA."""


@attrs.frozen
class ZooModels:
    """Zoo models under `root`, each built on first use (`zoo_models(arch)` is its path)."""

    root: Path

    def __call__(self, arch: str, *, quantized: bool = False) -> Path:
        return ensure_zoo_model(self.root, arch, quantized=quantized)


def chat_prompt(tokenizer: Any, text: str) -> list[int]:
    """`text` as the user's message, chat-templated, ready for the assistant's answer."""
    prompt: list[int] = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    return prompt


@attrs.frozen
class Greedy:
    """A greedy answer: its token ids and its text, as mlx-lm's detokenizer streams it."""

    tokens: list[int]
    text: str


def greedy(
    model: Any, tokenizer: Any, text: str, max_tokens: int, *, prefill_step: int = 2048
) -> Greedy:
    """mlx-lm's own greedy answer to `text`, in this process, reading the prompt
    `prefill_step` tokens at a time."""
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    responses = list(
        mlx_lm.stream_generate(
            model,
            tokenizer,
            chat_prompt(tokenizer, text),
            max_tokens=max_tokens,
            sampler=make_sampler(temp=0.0),
            prefill_step_size=prefill_step,
        )
    )
    return Greedy([r.token for r in responses], "".join(r.text for r in responses))


def batched_greedy(
    batch: Any, encode: Callable[[Any], list[int]], questions: tuple[str, ...], max_tokens: int
) -> list[list[int]]:
    """Each question's greedy tokens, all stepped together in `batch` (a `BatchEngine`),
    each request's prompt `encode(request)`."""
    from trexo.types.generation import ChatMessage, GenerationRequest, SamplingParams
    from trexo.types.ids import RequestId

    requests = [
        GenerationRequest(
            RequestId(f"r{k}"),
            messages=(ChatMessage("user", question),),
            params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        )
        for k, question in enumerate(questions)
    ]
    together: dict[str, list[int]] = {r.request_id: [] for r in requests}
    for request in requests:
        batch.add(request, encode(request))
    while batch:
        for chunk in batch.step():
            together[chunk.request_id] += chunk.token_ids
    return [together[r.request_id] for r in requests]
