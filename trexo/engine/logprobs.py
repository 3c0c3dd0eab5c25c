"""A generated token's log probability and its most likely rivals, as OpenAI reports them."""

from __future__ import annotations

from typing import Any, cast

import mlx.core as mx

from trexo.types.chunks import TokenLogprob, TopLogprob

LOGPROB_FLOOR = -9999.0
"""OpenAI's value for a token with (practically) no chance; JSON has no -Infinity."""


def token_logprob(tokenizer: Any, logprobs: mx.array, token: int, top: int) -> TokenLogprob:
    """`token`'s entry from one step's log probabilities (a vector over the vocabulary)."""
    rivals: list[TopLogprob] = []
    if top > 0:
        ids = cast(list[int], mx.argpartition(-logprobs, kth=top - 1)[:top].tolist())
        values = cast(list[float], logprobs[mx.array(ids)].tolist())
        for value, rival in sorted(zip(values, ids, strict=True), key=lambda pair: -pair[0]):
            text, floored, raw = _describe(tokenizer, rival, value)
            rivals.append(TopLogprob(text, floored, raw))
    text, floored, raw = _describe(tokenizer, int(token), cast(float, logprobs[token].item()))
    return TokenLogprob(text, floored, raw, tuple(rivals))


def _describe(tokenizer: Any, token: int, logprob: float) -> tuple[str, float, tuple[int, ...]]:
    # A token can hold part of a character: its text then has U+FFFD, as OpenAI's does.
    text = str(tokenizer.decode([token]))
    return text, max(logprob, LOGPROB_FLOOR), tuple(text.encode())
