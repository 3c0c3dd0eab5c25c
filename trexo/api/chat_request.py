"""Parse and validate an OpenAI Chat Completions request body. Pure: no I/O.

`parse_chat_request` takes the decoded JSON body and returns a `ChatRequest`, or raises a
400 `ApiError` naming the offending parameter, worded and coded as OpenAI's API words them.

Choices where OpenAI's API and trexo differ:
- An absent sampling field takes `SamplingParams`' default: `temperature` 0 (greedy) and
  `max_tokens` `DEFAULT_MAX_TOKENS`, as mlx-lm's server does, not OpenAI's 1.0 / unbounded.
- A `null` value means the field is absent, as in OpenAI's API.
- Unknown top-level fields are refused (OpenAI does the same), so a typo is not silently
  ignored. Fields inside messages are lenient, so replayed assistant messages
  (`refusal`, `annotations`, ...) are accepted.
- `developer` messages are passed to the chat template as `system`: mlx-lm chat templates
  know `system`, and OpenAI treats `developer` as its successor.
- Thinking models' switches reach the chat template (`trexo.api.reasoning_request`):
  `reasoning_effort` ("none" turns thinking off), `enable_thinking` (top-level, as Qwen's
  own API takes it), and vLLM's `chat_template_kwargs` (any template variables; they win
  over the other two). An assistant turn's `reasoning_content` (or `reasoning`) is replayed
  to the template.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypeVar

import attrs

from trexo.api.content import text_content
from trexo.api.errors import ApiError
from trexo.api.reasoning_request import client_kwargs, effort, template_kwargs_text, thinking
from trexo.api.tool_request import (
    parse_chat_tool_choice,
    parse_chat_tools,
    parse_response_format,
    parse_tool_calls,
)
from trexo.api.validation import (
    invalid_type,
    invalid_value,
    present,
    read_bool,
    read_int,
    read_number,
    read_str,
    require_object,
    required,
    required_str,
    same_json,
    unknown,
    unsupported,
    valid_text,
)
from trexo.types.generation import (
    MAX_TOP_LOGPROBS,
    ChatMessage,
    GenerationRequest,
    SamplingParams,
    ToolCall,
    ToolChoice,
)
from trexo.types.ids import RequestId, new_id

COMPLETION_ID_PREFIX = "chatcmpl-"
MAX_STOP_SEQUENCES = 4
"""OpenAI's limit on `stop`."""
MAX_SEED = 2**64 - 1
"""MLX seeds are unsigned 64-bit."""
MAX_TOKENS_LIMIT = 2**31 - 1
"""Beyond any model's context; the real bound is the context (`trexo.api.admission`)."""
MESSAGE_ROLES: Final = frozenset({"system", "user", "assistant", "tool", "developer"})
ROLE_ALIASES: Final = {"developer": "system"}

SUPPORTED_FIELDS: Final = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "repetition_penalty",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "logprobs",
        "top_logprobs",
        "response_format",
        "n",
        "frequency_penalty",
        "presence_penalty",
        "user",
        "reasoning_effort",
        "enable_thinking",
        "chat_template_kwargs",
    }
)
UNSUPPORTED_FIELDS: Final[Mapping[str, tuple[object, ...]]] = {
    # field -> the values (besides null) that ask for nothing, so they are accepted
    "functions": ([],),
    "function_call": ("none",),
    "logit_bias": ({},),
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "web_search_options": (),
    "store": (False,),
    "metadata": ({},),
    "service_tier": ("auto", "default"),
}
STREAM_OPTIONS_FIELDS: Final = frozenset({"include_usage", "include_obfuscation"})
REASONING_FIELDS: Final = ("reasoning_content", "reasoning")
"""Where a replayed assistant turn carries its reasoning (DeepSeek's and vLLM's name, and
the newer one of vLLM and OpenRouter)."""

T = TypeVar("T")


@attrs.frozen
class ChatRequest:
    """A validated Chat Completions request."""

    model_id: str
    generation: GenerationRequest
    stream: bool = False
    include_usage: bool = False
    """Streaming only: end the stream with a chunk carrying `usage` (`stream_options`)."""
    requested_max_tokens: int | None = None
    """`max_tokens` as the client gave it; None: what fits the context (see admission)."""

    @property
    def request_id(self) -> RequestId:
        return self.generation.request_id


def new_completion_id() -> RequestId:
    """An id like OpenAI's (`chatcmpl-<hex>`); it is also the generation's request id."""
    return RequestId(COMPLETION_ID_PREFIX + new_id())


def parse_chat_request(body: Any, request_id: RequestId | None = None) -> ChatRequest:
    """Validate a decoded JSON body; raise `ApiError` (400) on the first problem found.

    `request_id` defaults to a fresh `new_completion_id()`.
    """
    fields = present(require_object(body))
    refuse_unknown_and_unsupported(fields)

    model = required_str(fields, "model")
    if not model:
        raise invalid_value("model", "expected a non-empty string")
    messages = _parse_messages(required(fields, "messages"))

    check_n(fields)
    for penalty in ("frequency_penalty", "presence_penalty"):
        value = read_number(fields, penalty, low=-2.0, high=2.0)
        if value:
            raise unsupported(penalty, "use repetition_penalty instead")
    read_str(fields, "user")  # accepted and ignored, but it must be a string

    stream = read_bool(fields, "stream") or False
    include_usage = parse_stream_options(fields, stream=stream)
    params, requested_max_tokens = parse_sampling(fields)
    tools = parse_chat_tools(fields["tools"]) if "tools" in fields else ()
    tool_choice = parse_chat_tool_choice(fields.get("tool_choice"), tools)
    return ChatRequest(
        model_id=model,
        generation=GenerationRequest(
            request_id=request_id or new_completion_id(),
            messages=messages,
            params=params,
            tools=tools,
            tool_choice=tool_choice if tools else ToolChoice(),
            parallel_tool_calls=_first(read_bool(fields, "parallel_tool_calls"), True),
            logprobs=parse_logprobs(fields),
            response_format=parse_response_format(fields.get("response_format")),
            template_kwargs=parse_template_kwargs(fields),
        ),
        stream=stream,
        include_usage=include_usage,
        requested_max_tokens=requested_max_tokens,
    )


def parse_template_kwargs(fields: Mapping[str, Any]) -> str | None:
    """`reasoning_effort`, `enable_thinking` and `chat_template_kwargs`, as template variables."""
    kwargs = {
        **effort(read_str(fields, "reasoning_effort"), "reasoning_effort"),
        **thinking(read_bool(fields, "enable_thinking")),
        **client_kwargs(fields.get("chat_template_kwargs")),
    }
    where = "chat_template_kwargs" if "chat_template_kwargs" in fields else "reasoning_effort"
    return template_kwargs_text(kwargs, where)


def refuse_unknown_and_unsupported(
    fields: Mapping[str, Any],
    supported: frozenset[str] = SUPPORTED_FIELDS,
    neutral: Mapping[str, tuple[object, ...]] = UNSUPPORTED_FIELDS,
) -> None:
    """A 400 for a field that is neither `supported` nor a `neutral` value of one that is not
    (a value that asks for nothing, such as `"logit_bias": {}`)."""
    for name, value in fields.items():
        if name in supported:
            continue
        if name not in neutral:
            raise unknown(name)
        if not any(same_json(value, accepted) for accepted in neutral[name]):
            raise unsupported(name)


def _parse_messages(raw: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(raw, list):
        raise invalid_type("messages", "an array", raw)
    if not raw:
        raise ApiError(
            400,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            param="messages",
            code="empty_array",
        )
    return tuple(_parse_message(item, f"messages[{i}]") for i, item in enumerate(raw))


def _parse_message(raw: Any, where: str) -> ChatMessage:
    message = present(require_object(raw, where))
    role = required_str(message, "role", where=f"{where}.role")
    if role not in MESSAGE_ROLES:
        raise invalid_value(
            f"{where}.role",
            f"expected one of {', '.join(sorted(MESSAGE_ROLES))}, but got {role!r} instead",
        )
    calls: tuple[ToolCall, ...] = ()
    if role == "assistant" and "tool_calls" in message:
        calls = parse_tool_calls(message["tool_calls"], f"{where}.tool_calls")
    elif "tool_calls" in message:
        raise invalid_value(f"{where}.tool_calls", "only assistant messages make tool calls")
    name = read_str(message, "name", where=f"{where}.name")
    tool_call_id = None
    if role == "tool":
        tool_call_id = required_str(message, "tool_call_id", where=f"{where}.tool_call_id")
    if role == "assistant" and "content" not in message:
        text = ""  # an assistant turn that only made tool calls has null content
    else:
        text = text_content(
            required(message, "content", where=f"{where}.content"), f"{where}.content"
        )
    return ChatMessage(
        role=ROLE_ALIASES.get(role, role),
        content=text,
        tool_calls=calls,
        tool_call_id=tool_call_id,
        name=name if role == "tool" else None,
        reasoning=_replayed_reasoning(message, where) if role == "assistant" else "",
    )


def _replayed_reasoning(message: Mapping[str, Any], where: str) -> str:
    """An assistant turn's reasoning, if it carries it as text (leniently: a field of
    another shape is ignored, as any other unknown field of a message)."""
    for field in REASONING_FIELDS:
        value = message.get(field)
        if isinstance(value, str) and value:
            return valid_text(value, f"{where}.{field}")
    return ""


def parse_logprobs(fields: Mapping[str, Any]) -> int | None:
    """`logprobs` and `top_logprobs` as one number: None (off) or how many rivals to list."""
    wanted = read_bool(fields, "logprobs") or False
    top = read_int(fields, "top_logprobs", low=0, high=MAX_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise invalid_value("top_logprobs", "'logprobs' must be true when 'top_logprobs' is given")
    return (top or 0) if wanted else None


def check_n(fields: Mapping[str, Any]) -> None:
    n = read_int(fields, "n", low=1)
    if n is not None and n != 1:
        raise ApiError(
            400,
            "Only n=1 is supported: one choice per request.",
            param="n",
            code="unsupported_value",
        )


def parse_stream_options(fields: Mapping[str, Any], *, stream: bool) -> bool:
    """`stream_options.include_usage`; the options are only allowed with `stream`."""
    raw = fields.get("stream_options")
    if raw is None:
        return False
    if not stream:
        raise invalid_value("stream_options", "only allowed when 'stream' is enabled")
    if not isinstance(raw, dict):
        raise invalid_type("stream_options", "an object", raw)
    for name in raw:
        if name not in STREAM_OPTIONS_FIELDS:
            raise unknown(f"stream_options.{name}")
    options = present(raw)
    read_bool(options, "include_obfuscation", where="stream_options.include_obfuscation")
    return read_bool(options, "include_usage", where="stream_options.include_usage") or False


def parse_sampling(fields: Mapping[str, Any]) -> tuple[SamplingParams, int | None]:
    """The sampling parameters, and the `max_tokens` the client asked for (None if absent)."""
    defaults = SamplingParams()
    max_tokens = read_int(fields, "max_tokens", low=1, high=MAX_TOKENS_LIMIT)
    max_completion_tokens = read_int(fields, "max_completion_tokens", low=1, high=MAX_TOKENS_LIMIT)
    if None not in (max_tokens, max_completion_tokens) and max_tokens != max_completion_tokens:
        raise invalid_value(
            "max_completion_tokens", "it disagrees with max_tokens; give only one of them"
        )
    requested = max_completion_tokens if max_completion_tokens is not None else max_tokens
    params = SamplingParams(
        max_tokens=_first(requested, defaults.max_tokens),
        temperature=_first(
            read_number(fields, "temperature", low=0.0, high=2.0), defaults.temperature
        ),
        top_p=_first(read_number(fields, "top_p", low=0.0, high=1.0), defaults.top_p),
        top_k=_first(read_int(fields, "top_k", low=0), defaults.top_k),
        min_p=_first(read_number(fields, "min_p", low=0.0, high=1.0), defaults.min_p),
        seed=read_int(fields, "seed", low=0, high=MAX_SEED),
        repetition_penalty=read_number(fields, "repetition_penalty", low=0.0, low_open=True),
        stop=_parse_stop(fields.get("stop")),
    )
    return params, requested


def _parse_stop(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list):
        raise invalid_type("stop", "a string or an array of strings", raw)
    if len(stops) > MAX_STOP_SEQUENCES:
        raise invalid_value(
            "stop", f"expected at most {MAX_STOP_SEQUENCES} sequences, but got {len(stops)}"
        )
    for i, stop in enumerate(stops):
        where = "stop" if isinstance(raw, str) else f"stop[{i}]"
        if not isinstance(stop, str):
            raise invalid_type(where, "a string", stop)
        if not stop:
            raise invalid_value(where, "a stop sequence must not be empty")
        valid_text(stop, where)
    return tuple(stops)


def _first(*values: T | None) -> T:
    """The first value that is not None (the last one is a default, never None)."""
    for value in values:
        if value is not None:
            return value
    raise AssertionError("no default given")
