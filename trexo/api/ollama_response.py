"""Build Ollama API responses: answer lines from trexo chunks, and model descriptions. Pure:
clocks are passed in.

An answer streams as NDJSON: a line per piece of output (`done: false`), then a line with
`done: true`, the `done_reason` and the statistics; not streamed, it is one object with the
whole output and the statistics. An error mid-stream is a last line `{"error": ...}`.

Statistics: token counts are the generation's usage. Durations (nanoseconds) are measured at
the API, so they include queueing: `total_duration` from the request's arrival to its last
line, `prompt_eval_duration` from arrival to the first token (prefill), `eval_duration` from
the first token to the last (decode). `load_duration` is 0: a model answers only once placed
and loaded. A non-streaming answer is collected whole, so only its `total_duration` is known:
its prefill and decode durations are reported as 0.

A thinking model's reasoning is `message.thinking` (chat) or `thinking` (generate), apart
from the answer, as Ollama returns it; lines of reasoning carry an empty answer. The field is
left out when there is none.

Done reasons: "stop" and "length" as trexo's; a turn that called tools ends with "stop", as in
Ollama; "cancelled" (`POST /v1/cancel/{id}`) is reported as "stop" (the text so far is a
valid, shorter answer, and Ollama has no such reason).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

import attrs

from trexo.api.errors import ApiError
from trexo.api.handle import ModelListing
from trexo.api.ollama_request import Endpoint
from trexo.api.outcome import Outcome
from trexo.hub.curated import curated
from trexo.types.chunks import Chunk, FinishReason, TokenLogprob, TopLogprob, Usage
from trexo.types.generation import ToolCall

Clock = Callable[[], int]
"""Monotonic nanoseconds."""
WallClock = Callable[[], datetime]

_DONE_REASONS: Final[dict[FinishReason, str]] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "stop",
    "cancelled": "stop",
}
LOAD_REASON = "load"
MODEL_FORMAT = "safetensors"
"""MLX models are safetensors files (Ollama's own are "gguf")."""
CAPABILITIES: Final = ("completion", "tools")
"""Every model takes tools: the runner parses calls out of what the model writes."""
NEVER_EXPIRES: Final = "9999-12-31T23:59:59Z"
"""A placed model stays until its instance is deleted: no keep-alive expiry."""


def utc_now() -> datetime:
    return datetime.now(UTC)


def timestamp(moment: datetime) -> str:
    """RFC 3339 in UTC, as Ollama's `created_at` (`2024-07-22T20:33:28.123648Z`)."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def done_reason(reason: FinishReason) -> str:
    """Ollama's `done_reason`; `ValueError` for "error", which is reported as an error."""
    try:
        return _DONE_REASONS[reason]
    except KeyError:
        raise ValueError(f"finish reason {reason!r} is an error, not a finish") from None


@attrs.frozen
class Timings:
    """When an answer began (the request arrived), produced its first token, and ended."""

    started_ns: int
    first_token_ns: int | None
    """None: not observed (a non-streaming answer is collected whole)."""
    ended_ns: int


def stats(usage: Usage, timings: Timings) -> dict[str, int]:
    """The statistics of a done line (see the module docstring for what each measures)."""
    total = timings.ended_ns - timings.started_ns
    first = timings.first_token_ns
    return {
        "total_duration": total,
        "load_duration": 0,
        "prompt_eval_count": usage.prompt_tokens,
        "prompt_eval_duration": 0 if first is None else first - timings.started_ns,
        "eval_count": usage.completion_tokens,
        "eval_duration": 0 if first is None else timings.ended_ns - first,
    }


def tool_call_body(call: ToolCall, index: int) -> dict[str, Any]:
    """A call as Ollama's `tool_calls` entries have it: arguments as an object."""
    arguments = json.loads(call.arguments)  # the runner writes a JSON object
    return {"id": call.id, "function": {"index": index, "name": call.name, "arguments": arguments}}


def _top_body(entry: TopLogprob | TokenLogprob) -> dict[str, Any]:
    return {"token": entry.token, "logprob": entry.logprob, "bytes": list(entry.bytes)}


def logprobs_body(entries: tuple[TokenLogprob, ...]) -> list[dict[str, Any]]:
    """Ollama's `logprobs`: one entry per token, with its `top_logprobs`."""
    return [
        {**_top_body(entry), "top_logprobs": [_top_body(top) for top in entry.top]}
        for entry in entries
    ]


def _output(
    endpoint: Endpoint,
    text: str,
    calls: tuple[ToolCall, ...] = (),
    first_call: int = 0,
    thinking: str = "",
) -> dict[str, Any]:
    """The output fields of a line: chat's `message`, generate's `response` (and their
    `thinking`)."""
    if endpoint == "generate":
        return {"response": text, "thinking": thinking} if thinking else {"response": text}
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = [
            tool_call_body(call, first_call + i) for i, call in enumerate(calls)
        ]
    return {"message": message}


def _line(
    endpoint: Endpoint,
    model: str,
    created_at: str,
    text: str = "",
    calls: tuple[ToolCall, ...] = (),
    first_call: int = 0,
    thinking: str = "",
) -> dict[str, Any]:
    """A line's (or a whole answer's) model, time and output."""
    output = _output(endpoint, text, calls, first_call, thinking)
    return {"model": model, "created_at": created_at, **output}


def _done(reason: str, statistics: dict[str, int] | None = None) -> dict[str, Any]:
    return {"done": True, "done_reason": reason, **(statistics or {})}


def answer_body(
    endpoint: Endpoint,
    outcome: Outcome,
    *,
    model: str,
    created_at: str,
    timings: Timings,
    logprobs: bool = False,
) -> dict[str, Any]:
    """A whole answer (`stream: false`)."""
    body = {
        **_line(
            endpoint,
            model,
            created_at,
            outcome.text,
            outcome.tool_calls,
            thinking=outcome.reasoning,
        ),
        **_done(done_reason(outcome.finish_reason), stats(outcome.usage, timings)),
    }
    if logprobs:
        body["logprobs"] = logprobs_body(outcome.logprobs)
    return body


def load_body(endpoint: Endpoint, *, model: str, created_at: str) -> dict[str, Any]:
    """The answer to a request with no prompt (Ollama's "load the model")."""
    return {**_line(endpoint, model, created_at), **_done(LOAD_REASON)}


def error_body(error: ApiError) -> dict[str, Any]:
    """Ollama's error shape, for a response and for a stream's last line."""
    return {"error": error.message}


@attrs.define
class LineEncoder:
    """Turns one generation's chunks into Ollama's NDJSON lines (a `ChunkEvents`): a line per
    chunk with output, then the done line with the statistics. Times each line by `clock`."""

    endpoint: Endpoint
    model: str
    started_ns: int
    logprobs: bool = False
    clock: Clock = time.monotonic_ns
    wall_clock: WallClock = utc_now
    finished: bool = attrs.field(default=False, init=False)
    _first_token_ns: int | None = attrs.field(default=None, init=False)
    _completion_tokens: int = attrs.field(default=0, init=False)
    _calls: int = attrs.field(default=0, init=False)

    def opening(self) -> list[dict[str, Any]]:
        return []  # Ollama's stream begins with the first token

    def encode(self, chunk: Chunk) -> list[dict[str, Any]]:
        if self.finished:
            return []
        now_ns = self.clock()
        created_at = timestamp(self.wall_clock())
        produced = chunk.text or chunk.reasoning or chunk.token_ids or chunk.tool_calls
        if produced and self._first_token_ns is None:
            self._first_token_ns = now_ns
        self._completion_tokens += len(chunk.token_ids)
        lines = []
        logprobs = self.logprobs and bool(chunk.logprobs)
        if chunk.text or chunk.reasoning or chunk.tool_calls or logprobs:
            line = _line(
                self.endpoint,
                self.model,
                created_at,
                chunk.text,
                chunk.tool_calls,
                self._calls,
                chunk.reasoning,
            )
            line["done"] = False
            if logprobs:
                line["logprobs"] = logprobs_body(chunk.logprobs)
            self._calls += len(chunk.tool_calls)
            lines.append(line)
        if chunk.finish_reason is not None:
            self.finished = True
            usage = chunk.usage or Usage(0, self._completion_tokens)
            timings = Timings(self.started_ns, self._first_token_ns, now_ns)
            done = _done(done_reason(chunk.finish_reason), stats(usage, timings))
            lines.append({**_line(self.endpoint, self.model, created_at), **done})
        return lines

    def error(self, error: ApiError) -> list[dict[str, Any]]:
        self.finished = True
        return [error_body(error)]


# --- models ----------------------------------------------------------------------------------


def digest(listing: ModelListing) -> str:
    """A stable stand-in for Ollama's manifest digest: the hash of where the files are from
    (a hub model's source names its commit)."""
    return hashlib.sha256(listing.model.source.encode()).hexdigest()


def details_body(listing: ModelListing) -> dict[str, Any]:
    """Ollama's `details`; the parameter count and quantization are known for curated models."""
    entry = curated(listing.model.model_id)
    return {
        "parent_model": "",
        "format": MODEL_FORMAT,
        "family": "",
        "families": None,
        "parameter_size": entry.parameters if entry is not None else "",
        "quantization_level": entry.quantization if entry is not None else "",
    }


def _modified_at(listing: ModelListing) -> str:
    return timestamp(datetime.fromtimestamp(listing.model.created, UTC))


def tag_body(listing: ModelListing) -> dict[str, Any]:
    """A `GET /api/tags` entry."""
    model = listing.model
    return {
        "name": model.model_id,
        "model": model.model_id,
        "modified_at": _modified_at(listing),
        "size": model.size_bytes,
        "digest": digest(listing),
        "details": details_body(listing),
    }


def running_body(listing: ModelListing) -> dict[str, Any]:
    """A `GET /api/ps` entry: a model that can answer now. Where its weights sit (spread
    over the cluster, in unified memory) is not Ollama's VRAM: `size_vram` is 0."""
    model = listing.model
    return {
        "name": model.model_id,
        "model": model.model_id,
        "size": model.size_bytes,
        "digest": digest(listing),
        "details": details_body(listing),
        "expires_at": NEVER_EXPIRES,
        "size_vram": 0,
    }


def show_body(listing: ModelListing) -> dict[str, Any]:
    """`POST /api/show`: trexo's facts about the model under `model_info` (Ollama's keys
    there come from GGUF metadata, which MLX models do not have)."""
    model = listing.model
    info: dict[str, Any] = {
        "trexo.source": model.source,
        "trexo.size_bytes": model.size_bytes,
        "trexo.placed": listing.placed,
        "trexo.ready": listing.ready,
        "trexo.downloaded": listing.downloaded,
    }
    if model.layout is not None:
        info["trexo.n_layers"] = model.layout.n_layers
    return {
        "modelfile": "",
        "parameters": "",
        "template": "",
        "details": details_body(listing),
        "model_info": info,
        "capabilities": list(CAPABILITIES),
        "modified_at": _modified_at(listing),
    }
