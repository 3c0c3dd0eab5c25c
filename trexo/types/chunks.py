"""Generated output. Chunks travel point-to-point, never through the event log."""

from __future__ import annotations

from typing import Literal

import attrs

from trexo.types.ids import RequestId

FinishReason = Literal["stop", "length", "cancelled", "error"]


@attrs.frozen
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    """Of the prompt tokens, how many came from the runner's prompt cache (not prefilled)."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@attrs.frozen
class Chunk:
    """A piece of one request's output. The last chunk has `finish_reason` and `usage` set."""

    request_id: RequestId
    text: str
    token_ids: tuple[int, ...] = ()
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
