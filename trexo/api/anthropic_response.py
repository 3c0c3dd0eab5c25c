"""Build Anthropic Messages responses, streamed events and errors from trexo's. Pure: no I/O.

Stop reasons: "length" is `max_tokens`; a turn that made tool calls is `tool_use`; a turn
cut by one of the request's stop sequences is `stop_sequence`, naming it (the runner reports
which one matched); otherwise `end_turn`. "cancelled" (`POST /v1/cancel/{id}`) is
`end_turn` too: the text so far is a valid, shorter answer, and whoever cancelled knows.
"error" is never a stop reason: it is an error response, or an `error` event mid-stream.

Usage follows Anthropic's split of the prompt: `input_tokens` are the prompt tokens read
now, `cache_read_input_tokens` those the runner's prompt cache held (trexo's
`cached_tokens`), and nothing is written to a cache on request (`cache_creation_input_tokens`
0). Their sum is trexo's `prompt_tokens`.

A turn's content is its thinking (a thinking model's reasoning, as `thinking` blocks), its
text and a `tool_use` block per call (with the call's id), in the order the model wrote them,
streamed or not; a turn with no text and no call has one empty text block (a client may read
the text block after the thinking). A thinking block's `signature` is the SHA-256 of its
thinking, in hex: something to pass back, as clients do, not a proof that trexo checks (it
checks none). Streamed, a thinking block is `thinking_delta`s, then one `signature_delta`.

Errors are `{"type": "error", "error": {"type", "message"}}` with trexo's HTTP statuses; the
type names the status as Anthropic's API does. trexo's 503 keeps its status and Retry-After
(a 529 would be Anthropic's own "overloaded"): with a Retry-After it is `overloaded_error`
(no master yet, the model still loading: retry shortly), without one `api_error`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, Literal

import attrs

from trexo.api.errors import ApiError
from trexo.api.outcome import outcome_of
from trexo.types.chunks import Chunk, FinishReason, Usage
from trexo.types.generation import ToolCall

AnthropicStopReason = Literal["end_turn", "max_tokens", "tool_use", "stop_sequence"]

MESSAGE_TYPE = "message"
ASSISTANT = "assistant"

_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
}
OVERLOADED_ERROR = "overloaded_error"
"""Anthropic's word for a transient refusal to serve: retry shortly."""


def stop_reason(
    finish: FinishReason, *, called: bool, stop_sequence: str | None = None
) -> AnthropicStopReason:
    """Anthropic's stop reason for a trexo finish (`called`: the turn made tool calls;
    `stop_sequence`: the one that ended it); `ValueError` for "error"."""
    if finish == "error":
        raise ValueError("finish reason 'error' is an error, not a stop")
    if finish == "length":
        return "max_tokens"
    if called or finish == "tool_calls":
        return "tool_use"
    if stop_sequence is not None and finish == "stop":
        return "stop_sequence"
    return "end_turn"


def usage_body(usage: Usage) -> dict[str, int]:
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
    }


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def thinking_signature(thinking: str) -> str:
    return hashlib.sha256(thinking.encode()).hexdigest()


def thinking_block(thinking: str, *, shown: bool = True) -> dict[str, Any]:
    """A finished `thinking` block; not `shown` (display "omitted"), with no thinking."""
    signature = thinking_signature(thinking)
    return {"type": "thinking", "thinking": thinking if shown else "", "signature": signature}


def tool_use_block(call: ToolCall, *, streamed: bool = False) -> dict[str, Any]:
    """A call as a `tool_use` block; `streamed`: its input is empty (it follows as JSON)."""
    arguments = {} if streamed else json.loads(call.arguments)
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}


def content_blocks(chunks: Iterable[Chunk], *, show_thinking: bool = True) -> list[dict[str, Any]]:
    """A turn's content blocks, in the order the model wrote them (as they stream)."""
    blocks: list[dict[str, Any]] = []
    for chunk in chunks:
        for kind, text in (("thinking", chunk.reasoning), ("text", chunk.text)):
            if not text:
                continue
            if blocks and blocks[-1]["type"] == kind:
                blocks[-1][kind] += text
            else:
                blocks.append({"type": kind, kind: text})
        blocks += [tool_use_block(call) for call in chunk.tool_calls]
    if not any(block["type"] in ("text", "tool_use") for block in blocks):
        blocks.append(text_block(""))
    return [
        thinking_block(block["thinking"], shown=show_thinking)
        if block["type"] == "thinking"
        else block
        for block in blocks
    ]


def message_from_chunks(
    chunks: list[Chunk], *, message_id: str, model: str, show_thinking: bool = True
) -> dict[str, Any]:
    """The non-streaming `message` for a finished generation's chunks (the last one
    finishes it)."""
    outcome = outcome_of(chunks)
    return {
        "id": message_id,
        "type": MESSAGE_TYPE,
        "role": ASSISTANT,
        "model": model,
        "content": content_blocks(chunks, show_thinking=show_thinking),
        "stop_reason": stop_reason(
            outcome.finish_reason,
            called=bool(outcome.tool_calls),
            stop_sequence=outcome.stop_sequence,
        ),
        "stop_sequence": outcome.stop_sequence,
        "usage": usage_body(outcome.usage),
    }


def error_type(error: ApiError) -> str:
    """Anthropic's `error.type` for an error with trexo's status."""
    if error.status == 503:
        return OVERLOADED_ERROR if error.retry_after_s is not None else "api_error"
    if error.status in _ERROR_TYPES:
        return _ERROR_TYPES[error.status]
    return "api_error" if error.status >= 500 else "invalid_request_error"


def error_body(error: ApiError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(error), "message": error.message}}


@attrs.define
class MessageEvents:
    """Turns one generation's trexo chunks into Anthropic's stream events: `message_start`;
    per content block `content_block_start`, its deltas and `content_block_stop`; then
    `message_delta` (stop reason, usage) and `message_stop`. A
    `trexo.api.streaming.ChunkEvents`, framed as named SSE events.

    A text or thinking block stays open while its kind of text comes, and closes when the
    other kind, a call or the end comes (a thinking block with its `signature_delta`); with
    `show_thinking` false it gets no `thinking_delta`. trexo sends each call whole, so a
    `tool_use` block starts (with empty `input`), gets all its input in one
    `input_json_delta` and stops at once. `message_delta`'s usage is the whole
    usage (a client overwrites `message_start`'s with it): `input_tokens` there is the
    runner's count, where `message_start` has this node's (0 if it could not count).
    """

    message_id: str
    model: str
    input_tokens: int = 0
    show_thinking: bool = True
    finished: bool = attrs.field(default=False, init=False)
    _blocks: int = attrs.field(default=0, init=False)
    """How many content blocks have started."""
    _open: str | None = attrs.field(default=None, init=False)
    """The kind of the open block ("text", "thinking"); None when none is open."""
    _thinking: str = attrs.field(default="", init=False)
    """The open thinking block's text (its signature is made of it)."""
    _answered: bool = attrs.field(default=False, init=False)
    """A text or tool_use block has started."""
    _called: bool = attrs.field(default=False, init=False)
    _output_tokens: int = attrs.field(default=0, init=False)

    def opening(self) -> list[dict[str, Any]]:
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": MESSAGE_TYPE,
            "role": ASSISTANT,
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }
        return [{"type": "message_start", "message": message}]

    def encode(self, chunk: Chunk) -> list[dict[str, Any]]:
        """The events for one trexo chunk (none for an empty one, or after the end)."""
        if self.finished:
            return []
        self._output_tokens += len(chunk.token_ids)
        out: list[dict[str, Any]] = []
        if chunk.reasoning:
            out += self._open_block("thinking")
            self._thinking += chunk.reasoning
            if self.show_thinking:
                out.append(self._delta({"type": "thinking_delta", "thinking": chunk.reasoning}))
        if chunk.text:
            out += self._open_block("text")
            out.append(self._delta({"type": "text_delta", "text": chunk.text}))
        for call in chunk.tool_calls:
            out += self._close_block()
            self._answered = True
            out.append(self._start(tool_use_block(call, streamed=True)))
            out.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
            out.append(self._stop())
            self._called = True
        if chunk.finish_reason is not None:
            out += self._finish(chunk)
        return out

    def error(self, error: ApiError) -> list[dict[str, Any]]:
        self.finished = True
        return [error_body(error)]

    def _finish(self, chunk: Chunk) -> list[dict[str, Any]]:
        assert chunk.finish_reason is not None
        self.finished = True
        out = []
        if not self._answered:  # as the non-streamed message: a text block, if only empty
            out += self._open_block("text")
        out += self._close_block()
        usage = chunk.usage or Usage(self.input_tokens, self._output_tokens)
        delta = {
            "stop_reason": stop_reason(
                chunk.finish_reason, called=self._called, stop_sequence=chunk.stop_sequence
            ),
            "stop_sequence": chunk.stop_sequence,
        }
        out.append({"type": "message_delta", "delta": delta, "usage": usage_body(usage)})
        out.append({"type": "message_stop"})
        return out

    def _start(self, block: dict[str, Any]) -> dict[str, Any]:
        self._blocks += 1
        return {"type": "content_block_start", "index": self._blocks - 1, "content_block": block}

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self._blocks - 1, "delta": delta}

    def _stop(self) -> dict[str, Any]:
        return {"type": "content_block_stop", "index": self._blocks - 1}

    def _open_block(self, kind: str) -> list[dict[str, Any]]:
        """The events that leave a block of `kind` open: the open one's end, if it is of
        another kind, and the new one's start."""
        if self._open == kind:
            return []
        out = self._close_block()
        self._open = kind
        if kind == "thinking":
            out.append(self._start({"type": "thinking", "thinking": "", "signature": ""}))
        else:
            self._answered = True
            out.append(self._start(text_block("")))
        return out

    def _close_block(self) -> list[dict[str, Any]]:
        out = []
        if self._open == "thinking":
            signature = thinking_signature(self._thinking)
            out.append(self._delta({"type": "signature_delta", "signature": signature}))
            self._thinking = ""
        if self._open is not None:
            out.append(self._stop())
        self._open = None
        return out
