"""Build OpenAI Chat Completions responses from trexo chunks. Pure: no I/O.

Finish reasons: trexo's "stop" and "length" are OpenAI's. "cancelled" (someone called
`POST /v1/cancel/{id}`) is reported as "stop": the text so far is a valid, shorter answer,
OpenAI has no such reason, and strict clients reject unknown ones; whoever cancelled knows.
"error" never becomes a finish reason: it is reported as an error (see `trexo.api.errors`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import attrs

from trexo.types.chunks import Chunk, FinishReason, Usage
from trexo.types.ids import RequestId

OpenAIFinishReason = Literal["stop", "length"]

COMPLETION_OBJECT = "chat.completion"
CHUNK_OBJECT = "chat.completion.chunk"

_FINISH_REASONS: dict[FinishReason, OpenAIFinishReason] = {
    "stop": "stop",
    "length": "length",
    "cancelled": "stop",
}


def openai_finish_reason(reason: FinishReason) -> OpenAIFinishReason:
    """OpenAI's name for a trexo finish reason; `ValueError` for "error"."""
    try:
        return _FINISH_REASONS[reason]
    except KeyError:
        raise ValueError(f"finish reason {reason!r} is an error, not a finish") from None


def usage_body(usage: Usage) -> dict[str, Any]:
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens` counts the prompt tokens
    the runner's prompt cache held (a conversation's earlier turns), which it did not read."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def usage_of(chunks: Iterable[Chunk]) -> Usage:
    """The usage the final chunk reports; counted from token ids if it reports none."""
    chunks = list(chunks)
    for chunk in reversed(chunks):
        if chunk.usage is not None:
            return chunk.usage
    return Usage(prompt_tokens=0, completion_tokens=sum(len(c.token_ids) for c in chunks))


def completion_body(
    *,
    request_id: RequestId,
    model: str,
    created: int,
    text: str,
    finish_reason: FinishReason,
    usage: Usage,
) -> dict[str, Any]:
    """A non-streaming `chat.completion` object with one choice."""
    return {
        "id": request_id,
        "object": COMPLETION_OBJECT,
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": openai_finish_reason(finish_reason),
            }
        ],
        "usage": usage_body(usage),
    }


def completion_from_chunks(
    chunks: Iterable[Chunk], *, request_id: RequestId, model: str, created: int
) -> dict[str, Any]:
    """The `chat.completion` for a finished generation's chunks (the last one finishes it)."""
    chunks = list(chunks)
    if not chunks or chunks[-1].finish_reason is None:
        raise ValueError("a completion needs the chunks of a finished generation")
    return completion_body(
        request_id=request_id,
        model=model,
        created=created,
        text="".join(chunk.text for chunk in chunks),
        finish_reason=chunks[-1].finish_reason,
        usage=usage_of(chunks),
    )


@attrs.define
class ChunkEncoder:
    """Turns one generation's trexo chunks into `chat.completion.chunk` objects, as OpenAI
    streams them: a first chunk with the role, content deltas, a chunk with the finish reason,
    and with `include_usage` a last chunk with no choices and the usage (every other chunk
    then has `"usage": null`).
    """

    request_id: RequestId
    model: str
    created: int
    include_usage: bool = False
    finished: bool = attrs.field(default=False, init=False)
    _completion_tokens: int = attrs.field(default=0, init=False)

    def opening(self) -> dict[str, Any]:
        """The first chunk: the assistant role and empty content, sent before any tokens."""
        return self._chunk({"role": "assistant", "content": ""}, None)

    def encode(self, chunk: Chunk) -> list[dict[str, Any]]:
        """The chunk objects for one trexo chunk (none for an empty one, or after the end)."""
        if self.finished:
            return []
        self._completion_tokens += len(chunk.token_ids)
        out = []
        if chunk.text:
            out.append(self._chunk({"content": chunk.text}, None))
        if chunk.finish_reason is not None:
            self.finished = True
            out.append(self._chunk({}, openai_finish_reason(chunk.finish_reason)))
            if self.include_usage:
                usage = chunk.usage or Usage(0, self._completion_tokens)
                out.append(self._envelope([], usage_body(usage)))
        return out

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return self._envelope([choice], None)

    def _envelope(
        self, choices: list[dict[str, Any]], usage: dict[str, int] | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.request_id,
            "object": CHUNK_OBJECT,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = usage
        return body
