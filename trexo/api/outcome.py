"""A finished generation, summed up from its chunks: what every dialect's non-streaming
response is built from."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from trexo.types.chunks import Chunk, FinishReason, TokenLogprob, Usage
from trexo.types.generation import ToolCall


@attrs.frozen
class Outcome:
    text: str
    finish_reason: FinishReason
    usage: Usage
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    stop_sequence: str | None = None
    reasoning: str = ""
    """The model's reasoning (its think block), apart from its answer `text`."""


def usage_of(chunks: Iterable[Chunk]) -> Usage:
    """The usage the final chunk reports; counted from token ids if it reports none."""
    chunks = list(chunks)
    for chunk in reversed(chunks):
        if chunk.usage is not None:
            return chunk.usage
    return Usage(prompt_tokens=0, completion_tokens=sum(len(c.token_ids) for c in chunks))


def outcome_of(chunks: Iterable[Chunk]) -> Outcome:
    """The outcome of a finished generation's chunks (the last one finishes it)."""
    chunks = list(chunks)
    if not chunks or chunks[-1].finish_reason is None:
        raise ValueError("an outcome needs the chunks of a finished generation")
    return Outcome(
        text="".join(chunk.text for chunk in chunks),
        finish_reason=chunks[-1].finish_reason,
        usage=usage_of(chunks),
        tool_calls=tuple(call for chunk in chunks for call in chunk.tool_calls),
        logprobs=tuple(entry for chunk in chunks for entry in chunk.logprobs),
        stop_sequence=chunks[-1].stop_sequence,
        reasoning="".join(chunk.reasoning for chunk in chunks),
    )
