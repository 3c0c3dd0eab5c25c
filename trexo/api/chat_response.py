"""Build OpenAI Chat Completions responses from trexo chunks. Pure: no I/O.

Finish reasons: trexo's "stop", "length" and "tool_calls" are OpenAI's. "cancelled" (someone
called `POST /v1/cancel/{id}`) is reported as "stop": the text so far is a valid, shorter
answer, OpenAI has no such reason, and strict clients reject unknown ones; whoever cancelled
knows. "error" never becomes a finish reason: it is reported as an error
(see `trexo.api.errors`).

A thinking model's reasoning is the message's `reasoning_content` (in a stream, deltas of
`reasoning_content` before the `content` ones), the field DeepSeek's API and vLLM answer
with; OpenAI's own models return none. It is left out when the model did not reason, and
`usage.completion_tokens_details.reasoning_tokens` counts its tokens.

Tool calls stream as OpenAI streams them: each call's first delta carries its `index`, `id`,
`type` and function `name`, with its `arguments` (trexo sends each call whole, once the model
has finished writing it, so one delta holds all of it).
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from trexo.api.errors import ApiError
from trexo.api.outcome import Outcome, outcome_of
from trexo.types.chunks import Chunk, FinishReason, TokenLogprob, TopLogprob, Usage
from trexo.types.generation import ToolCall
from trexo.types.ids import RequestId

OpenAIFinishReason = Literal["stop", "length", "tool_calls"]

REASONING_FIELD = "reasoning_content"
COMPLETION_OBJECT = "chat.completion"
CHUNK_OBJECT = "chat.completion.chunk"

_FINISH_REASONS: dict[FinishReason, OpenAIFinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
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
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def tool_call_body(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    """A call as OpenAI's `tool_calls` entries have it (`index` in stream deltas)."""
    body: dict[str, Any] = {} if index is None else {"index": index}
    body.update(
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
    )
    return body


def _top_body(entry: TopLogprob | TokenLogprob) -> dict[str, Any]:
    return {"token": entry.token, "logprob": entry.logprob, "bytes": list(entry.bytes)}


def logprobs_body(entries: tuple[TokenLogprob, ...]) -> dict[str, Any]:
    """OpenAI's `logprobs` of a choice: one `content` entry per token."""
    content = [
        {**_top_body(entry), "top_logprobs": [_top_body(top) for top in entry.top]}
        for entry in entries
    ]
    return {"content": content, "refusal": None}


def message_body(outcome: Outcome) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": outcome.text, "refusal": None}
    if outcome.reasoning:
        message[REASONING_FIELD] = outcome.reasoning
    if outcome.tool_calls:
        # As OpenAI answers a turn of only calls: content null, not "".
        message["content"] = outcome.text or None
        message["tool_calls"] = [tool_call_body(call) for call in outcome.tool_calls]
    return message


def completion_body(
    outcome: Outcome,
    *,
    request_id: RequestId,
    model: str,
    created: int,
    logprobs: bool = False,
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
                "message": message_body(outcome),
                "logprobs": logprobs_body(outcome.logprobs) if logprobs else None,
                "finish_reason": openai_finish_reason(outcome.finish_reason),
            }
        ],
        "usage": usage_body(outcome.usage),
    }


def completion_from_chunks(
    chunks: list[Chunk], *, request_id: RequestId, model: str, created: int, logprobs: bool = False
) -> dict[str, Any]:
    """The `chat.completion` for a finished generation's chunks (the last one finishes it)."""
    return completion_body(
        outcome_of(chunks), request_id=request_id, model=model, created=created, logprobs=logprobs
    )


@attrs.define
class ChunkEncoder:
    """Turns one generation's trexo chunks into `chat.completion.chunk` objects, as OpenAI
    streams them: a first chunk with the role, then reasoning, content and tool-call deltas,
    a chunk with the finish reason, and with `include_usage` a last chunk with no choices and
    the usage (every other chunk then has `"usage": null`). A
    `trexo.api.streaming.ChunkEvents`.
    """

    request_id: RequestId
    model: str
    created: int
    include_usage: bool = False
    logprobs: bool = False
    finished: bool = attrs.field(default=False, init=False)
    _completion_tokens: int = attrs.field(default=0, init=False)
    _calls: int = attrs.field(default=0, init=False)

    def opening(self) -> list[dict[str, Any]]:
        """The first chunk: the assistant role and empty content, sent before any tokens."""
        return [self._chunk({"role": "assistant", "content": ""}, None)]

    def encode(self, chunk: Chunk) -> list[dict[str, Any]]:
        """The chunk objects for one trexo chunk (none for an empty one, or after the end)."""
        if self.finished:
            return []
        self._completion_tokens += len(chunk.token_ids)
        out = []
        logprobs = logprobs_body(chunk.logprobs) if self.logprobs and chunk.logprobs else None
        if chunk.reasoning:
            out.append(self._chunk({REASONING_FIELD: chunk.reasoning}, None, logprobs))
            logprobs = None  # a token's log probability goes with its first delta
        if chunk.text or logprobs is not None:
            out.append(self._chunk({"content": chunk.text}, None, logprobs))
        if chunk.tool_calls:
            calls = []
            for call in chunk.tool_calls:
                calls.append(tool_call_body(call, self._calls))
                self._calls += 1
            out.append(self._chunk({"tool_calls": calls}, None))
        if chunk.finish_reason is not None:
            self.finished = True
            out.append(self._chunk({}, openai_finish_reason(chunk.finish_reason)))
            if self.include_usage:
                usage = chunk.usage or Usage(0, self._completion_tokens)
                out.append(self._envelope([], usage_body(usage)))
        return out

    def error(self, error: ApiError) -> list[dict[str, Any]]:
        self.finished = True
        return [error.body()]

    def _chunk(
        self,
        delta: dict[str, Any],
        finish_reason: str | None,
        logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return self._envelope([choice], None)

    def _envelope(
        self, choices: list[dict[str, Any]], usage: dict[str, Any] | None
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
