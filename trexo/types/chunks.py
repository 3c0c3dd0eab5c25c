"""Generated output. Chunks travel point-to-point, never through the event log."""

from __future__ import annotations

from typing import Literal

import attrs

from trexo.types.generation import ToolCall
from trexo.types.ids import RequestId

FinishReason = Literal["stop", "length", "tool_calls", "cancelled", "error"]


@attrs.frozen
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    """Of the prompt tokens, how many came from the runner's prompt cache (not prefilled)."""
    reasoning_tokens: int = 0
    """Of the completion tokens, how many were the model's reasoning (its think block)."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@attrs.frozen
class TopLogprob:
    token: str
    logprob: float
    bytes: tuple[int, ...]
    """The token's UTF-8 bytes (a token can hold part of a character)."""


@attrs.frozen
class TokenLogprob:
    """One generated token's log probability, with the most likely alternatives."""

    token: str
    logprob: float
    bytes: tuple[int, ...]
    top: tuple[TopLogprob, ...] = ()


@attrs.frozen
class Chunk:
    """A piece of one request's output. The last chunk has `finish_reason` and `usage` set.

    `text` is what the model said; `reasoning` what it thought before saying it (a thinking
    model's think block, apart from its answer); `tool_calls` are calls it completed in this
    piece (parsed out of its text, which then does not hold them). In a piece, the reasoning
    comes first, then the text, then the calls. `logprobs`, when asked for, has one entry per
    token in `token_ids`.
    """

    request_id: RequestId
    text: str
    token_ids: tuple[int, ...] = ()
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    stop_sequence: str | None = None
    """On a final chunk: the request's stop sequence that ended the output, if one did."""
    reasoning: str = ""
