"""OpenAI's legacy text completions, `POST /v1/completions`: a raw prompt, no chat template.
Parsing and response building; pure, no I/O.

The sampling fields, their limits and defaults are Chat Completions' (`trexo.api.chat_request`):
an absent `max_tokens` is what fits the context, not OpenAI's 16. `logprobs` is the legacy
API's integer (how many alternatives per token, up to 5); the response carries the legacy
`tokens` / `token_logprobs` / `top_logprobs` / `text_offset` lists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from trexo.api.chat_request import (
    check_n,
    parse_sampling,
    parse_stream_options,
    refuse_unknown_and_unsupported,
)
from trexo.api.chat_response import openai_finish_reason, usage_body
from trexo.api.errors import ApiError
from trexo.api.outcome import outcome_of
from trexo.api.validation import (
    invalid_type,
    invalid_value,
    present,
    read_int,
    read_number,
    read_str,
    require_object,
    required,
    required_str,
    valid_text,
)
from trexo.types.chunks import Chunk, TokenLogprob, Usage
from trexo.types.generation import GenerationRequest
from trexo.types.ids import RequestId, new_id

TEXT_COMPLETION_OBJECT = "text_completion"
COMPLETION_ID_PREFIX = "cmpl-"
MAX_LEGACY_LOGPROBS = 5
"""The legacy API's limit on `logprobs`."""

SUPPORTED_FIELDS: Final = frozenset(
    {
        "model",
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "repetition_penalty",
        "logprobs",
        "n",
        "frequency_penalty",
        "presence_penalty",
        "user",
    }
)
NEUTRAL_FIELDS: Final[Mapping[str, tuple[object, ...]]] = {
    "echo": (False,),
    "best_of": (1,),
    "suffix": (),
    "logit_bias": ({},),
}


@attrs.frozen
class CompletionRequest:
    model_id: str
    generation: GenerationRequest
    stream: bool = False
    include_usage: bool = False
    requested_max_tokens: int | None = None

    @property
    def request_id(self) -> RequestId:
        return self.generation.request_id


def parse_completion_request(body: Any) -> CompletionRequest:
    """Validate a decoded `/v1/completions` body; a 400 `ApiError` on the first problem."""
    fields = present(require_object(body))
    refuse_unknown_and_unsupported(fields, SUPPORTED_FIELDS, NEUTRAL_FIELDS)
    model = required_str(fields, "model")
    if not model:
        raise invalid_value("model", "expected a non-empty string")
    prompt = _prompt(required(fields, "prompt"))
    check_n(fields)
    for penalty in ("frequency_penalty", "presence_penalty"):
        if read_number(fields, penalty, low=-2.0, high=2.0):
            raise ApiError(
                400,
                f"Unsupported parameter: '{penalty}' is not supported by trexo. "
                "Hint: use repetition_penalty instead.",
                param=penalty,
                code="unsupported_parameter",
            )
    read_str(fields, "user")
    stream = fields.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid_type("stream", "a boolean", stream)
    include_usage = parse_stream_options(fields, stream=stream)
    params, requested = parse_sampling(fields)
    return CompletionRequest(
        model_id=model,
        generation=GenerationRequest(
            request_id=RequestId(COMPLETION_ID_PREFIX + new_id()),
            prompt=prompt,
            params=params,
            logprobs=read_int(fields, "logprobs", low=0, high=MAX_LEGACY_LOGPROBS),
        ),
        stream=stream,
        include_usage=include_usage,
        requested_max_tokens=requested,
    )


def _prompt(raw: Any) -> str:
    """One prompt: a string, or an array holding one string (token arrays are refused)."""
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
        raw = raw[0]
    elif isinstance(raw, list) and raw and all(isinstance(item, str) for item in raw):
        raise ApiError(
            400,
            "Only one prompt per request is supported; send one request per prompt.",
            param="prompt",
            code="unsupported_value",
        )
    if not isinstance(raw, str):
        raise invalid_type("prompt", "a string", raw)
    if not raw:
        raise invalid_value("prompt", "expected a non-empty string")
    return valid_text(raw, "prompt")


def legacy_logprobs(entries: tuple[TokenLogprob, ...], offset: int = 0) -> dict[str, Any]:
    """The legacy `logprobs` object; `offset`: where the first token starts in the text."""
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.token)
    return {
        "tokens": [entry.token for entry in entries],
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [{top.token: top.logprob for top in entry.top} for entry in entries],
        "text_offset": offsets,
    }


def completion_body(
    chunks: list[Chunk], *, request: CompletionRequest, created: int
) -> dict[str, Any]:
    outcome = outcome_of(chunks)
    logprobs = request.generation.logprobs is not None
    return _envelope(
        request,
        created,
        {
            "text": outcome.text,
            "index": 0,
            "logprobs": legacy_logprobs(outcome.logprobs) if logprobs else None,
            "finish_reason": openai_finish_reason(outcome.finish_reason),
        },
        usage_body(outcome.usage),
    )


def _envelope(
    request: CompletionRequest,
    created: int,
    choice: dict[str, Any] | None,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    return {
        "id": request.request_id,
        "object": TEXT_COMPLETION_OBJECT,
        "created": created,
        "model": request.model_id,
        "system_fingerprint": None,
        "choices": [] if choice is None else [choice],
        "usage": usage,
    }


@attrs.define
class CompletionEvents:
    """Streamed `text_completion` objects: text deltas, the finish reason on the last one, and
    with `include_usage` a choiceless usage object after it. A `ChunkEvents`."""

    request: CompletionRequest
    created: int
    finished: bool = attrs.field(default=False, init=False)
    _offset: int = attrs.field(default=0, init=False)
    _completion_tokens: int = attrs.field(default=0, init=False)

    def opening(self) -> list[dict[str, Any]]:
        return []

    def encode(self, chunk: Chunk) -> list[dict[str, Any]]:
        if self.finished:
            return []
        self._completion_tokens += len(chunk.token_ids)
        final = chunk.finish_reason is not None
        if not (chunk.text or final or chunk.logprobs):
            return []
        logprobs = None
        if self.request.generation.logprobs is not None:
            logprobs = legacy_logprobs(chunk.logprobs, self._offset)
        self._offset += len(chunk.text)
        choice = {
            "text": chunk.text,
            "index": 0,
            "logprobs": logprobs,
            "finish_reason": openai_finish_reason(chunk.finish_reason)  # type: ignore[arg-type]
            if final
            else None,
        }
        out = [_envelope(self.request, self.created, choice, None)]
        if final:
            self.finished = True
            if self.request.include_usage:
                usage = chunk.usage or Usage(0, self._completion_tokens)
                out.append(_envelope(self.request, self.created, None, usage_body(usage)))
        return out

    def error(self, error: ApiError) -> list[dict[str, Any]]:
        self.finished = True
        return [error.body()]
