"""The model zoo for tests (`trexo.engine.zoo`): a factory that builds each architecture once
per session, and the greedy reference every test of a zoo model compares with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from trexo.engine.zoo import ensure_zoo_model

LONG_QUESTION = (
    "Explain, in a few short sentences, what the with statement does in Python and why "
    "context managers make the cleanup of files and locks reliable."
)
"""Chat-templated, longer than every sliding window of the zoo (`test_zoo` checks it)."""
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


def greedy(model: Any, tokenizer: Any, text: str, max_tokens: int) -> Greedy:
    """mlx-lm's own greedy answer to `text`, in this process."""
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    responses = list(
        mlx_lm.stream_generate(
            model,
            tokenizer,
            chat_prompt(tokenizer, text),
            max_tokens=max_tokens,
            sampler=make_sampler(temp=0.0),
        )
    )
    return Greedy([r.token for r in responses], "".join(r.text for r in responses))
