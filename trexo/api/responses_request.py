"""Parse and validate an OpenAI Responses request body (`POST /v1/responses`). Pure: no I/O.

`parse_responses_request` takes the decoded JSON body and returns a `ResponsesRequest`, or
raises a 400 `ApiError` naming the offending parameter, in OpenAI's error shape.

Choices where OpenAI's API and trexo differ:
- trexo is stateless: `store` is accepted but nothing is kept, so `previous_response_id`,
  `conversation` and `item_reference` inputs are refused with a 400 that says so.
- An absent sampling field takes `SamplingParams`' default, as in Chat Completions:
  `temperature` 0 (greedy), `max_output_tokens` what fits the context up to
  `DEFAULT_MAX_TOKENS` (`trexo.api.admission`).
- Only function tools; `system` and `developer` messages (and `instructions`, placed first)
  are passed to the chat template as `system`.
- Unknown top-level fields are refused, as OpenAI does; fields inside input items are
  lenient (`id`, `status`, `annotations`, ...), so output items can be replayed as input.
- `reasoning.effort` reaches the chat template (`trexo.api.reasoning_request`): "none"
  turns thinking off, any other is the template's `reasoning_effort`; `reasoning.summary`
  is accepted, but the reasoning comes whole (as a reasoning item's `content`), never
  summarised. A replayed `reasoning` item is the reasoning of the assistant turn after it;
  `include: ["reasoning.encrypted_content"]` asks for nothing trexo has (its reasoning items
  hold their text).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from trexo.api.content import text_content
from trexo.api.errors import ApiError
from trexo.api.reasoning_request import effort, template_kwargs_text
from trexo.api.tool_request import (
    arguments_text,
    check_tools,
    checked_tool_choice,
    json_schema_format,
    parse_function,
    require_function_type,
    tool_choice_mode,
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
    ChatMessage,
    GenerationRequest,
    ResponseFormat,
    SamplingParams,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from trexo.types.ids import RequestId, new_id

RESPONSE_ID_PREFIX = "resp_"
MAX_OUTPUT_TOKENS_LIMIT = 2**31 - 1
"""Beyond any model's context; the real bound is the context (`trexo.api.admission`)."""
MAX_METADATA_KEYS = 16
"""OpenAI's limits on `metadata`."""
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
DEFAULT_TOP_P = 1.0
"""What the response echoes for an absent `top_p` (no nucleus filtering)."""

MESSAGE_ROLES: Final = ("assistant", "developer", "system", "user")
ROLE_ALIASES: Final = {"developer": "system"}
TEXT_PART_TYPES: Final = frozenset({"input_text", "output_text"})
STATELESS = "trexo does not store responses"

SUPPORTED_FIELDS: Final = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "temperature",
        "top_p",
        "stream",
        "stream_options",
        "text",
        "metadata",
        "user",
        "store",
        "reasoning",
        "truncation",
        "safety_identifier",
        "prompt_cache_key",
    }
)
UNSUPPORTED_FIELDS: Final[Mapping[str, tuple[object, ...]]] = {
    # field -> the values (besides null) that ask for nothing, so they are accepted
    "background": (False,),
    "include": ([], ["reasoning.encrypted_content"]),
    "max_tool_calls": (),
    "prompt": (),
    "prompt_cache_retention": (),
    "service_tier": ("auto", "default"),
    "top_logprobs": (0,),
    "context_management": ([],),
}
STATEFUL_FIELDS: Final = ("previous_response_id", "conversation")
"""Fields that point at stored state: refused, naming why."""
TEXT_FIELDS: Final = frozenset({"format", "verbosity"})
REASONING_FIELDS: Final = frozenset({"effort", "summary", "generate_summary"})
REASONING_SUMMARIES: Final = ("auto", "concise", "detailed")
REASONING_TEXT_TYPES: Final = frozenset({"reasoning_text", "summary_text"})
STREAM_OPTIONS_FIELDS: Final = frozenset({"include_obfuscation"})


@attrs.frozen
class ResponsesRequest:
    """A validated Responses request."""

    model_id: str
    generation: GenerationRequest
    stream: bool = False
    requested_max_tokens: int | None = None
    """`max_output_tokens` as the client gave it; None: what fits the context."""
    echo: Mapping[str, Any] = attrs.field(factory=dict)
    """The response object's fields that repeat the request (`tools`, `tool_choice`,
    `text`, `temperature`, ...), as JSON values."""

    @property
    def response_id(self) -> RequestId:
        return self.generation.request_id


def new_response_id() -> RequestId:
    """An id like OpenAI's (`resp_<hex>`); it is also the generation's request id."""
    return RequestId(RESPONSE_ID_PREFIX + new_id())


def not_stored(response_id: str) -> ApiError:
    """The 404 for any stored response asked for by id."""
    return ApiError(
        404,
        f"No response with id '{response_id}' found: {STATELESS} (it is stateless), "
        "so a response cannot be retrieved after it is returned.",
        param="response_id",
        code="response_not_found",
    )


def parse_responses_request(body: Any, request_id: RequestId | None = None) -> ResponsesRequest:
    """Validate a decoded JSON body; raise `ApiError` (400) on the first problem found.

    `request_id` defaults to a fresh `new_response_id()`.
    """
    fields = present(require_object(body))
    _refuse_unknown_and_unsupported(fields)

    model = required_str(fields, "model")
    instructions = read_str(fields, "instructions")
    messages = _parse_input(required(fields, "input"))
    if instructions is not None:
        valid_text(instructions, "instructions")
        messages = (ChatMessage("system", instructions), *messages)

    stream = read_bool(fields, "stream") or False
    _check_stream_options(fields, stream=stream)
    requested = read_int(fields, "max_output_tokens", low=1, high=MAX_OUTPUT_TOKENS_LIMIT)
    temperature = read_number(fields, "temperature", low=0.0, high=2.0)
    top_p = read_number(fields, "top_p", low=0.0, high=1.0)
    defaults = SamplingParams()
    params = SamplingParams(
        max_tokens=defaults.max_tokens if requested is None else requested,
        temperature=defaults.temperature if temperature is None else temperature,
        top_p=defaults.top_p if top_p is None else top_p,
    )
    tools, tools_echo = _parse_tools(fields.get("tools", []))
    tool_choice, tool_choice_echo = _parse_tool_choice(fields.get("tool_choice"), tools)
    response_format, text_echo = _parse_text(fields.get("text"))
    parallel = read_bool(fields, "parallel_tool_calls")
    parallel = True if parallel is None else parallel
    for name in ("user", "safety_identifier", "prompt_cache_key"):
        read_str(fields, name)  # accepted and ignored, but each must be a string
    read_bool(fields, "store")
    reasoning_echo = _parse_reasoning(fields.get("reasoning"))
    _check_truncation(fields)

    echo: dict[str, Any] = {
        "instructions": instructions,
        "max_output_tokens": requested,
        "metadata": _parse_metadata(fields.get("metadata")),
        "parallel_tool_calls": parallel,
        "previous_response_id": None,
        "reasoning": reasoning_echo,
        "store": False,  # whatever was asked: nothing is kept
        "temperature": params.temperature,
        "text": text_echo,
        "tool_choice": tool_choice_echo,
        "tools": tools_echo,
        "top_p": DEFAULT_TOP_P if top_p is None else top_p,
        "truncation": "disabled",
        "user": fields.get("user"),
    }
    return ResponsesRequest(
        model_id=model,
        generation=GenerationRequest(
            request_id=request_id or new_response_id(),
            messages=messages,
            params=params,
            tools=tools,
            tool_choice=tool_choice if tools else ToolChoice(),
            parallel_tool_calls=parallel,
            response_format=response_format,
            template_kwargs=template_kwargs_text(
                effort(reasoning_echo["effort"], "reasoning.effort"), "reasoning.effort"
            ),
        ),
        stream=stream,
        requested_max_tokens=requested,
        echo=echo,
    )


def _refuse_unknown_and_unsupported(fields: Mapping[str, Any]) -> None:
    for name, value in fields.items():
        if name in SUPPORTED_FIELDS:
            continue
        if name in STATEFUL_FIELDS:
            raise ApiError(
                400,
                f"Unsupported parameter: '{name}': {STATELESS} (it is stateless), so a request "
                "cannot refer to an earlier one. Send the whole conversation in 'input' instead.",
                param=name,
                code="unsupported_parameter",
            )
        if name not in UNSUPPORTED_FIELDS:
            raise unknown(name)
        if not any(same_json(value, neutral) for neutral in UNSUPPORTED_FIELDS[name]):
            raise unsupported(name)


# --- input ---------------------------------------------------------------------------------


def _parse_input(raw: Any) -> tuple[ChatMessage, ...]:
    """The conversation: a string is one user message; a list holds messages, function
    calls and their outputs. Consecutive calls (after the assistant's text, if any) form one
    assistant turn, as chat templates expect."""
    if isinstance(raw, str):
        return (ChatMessage("user", valid_text(raw, "input")),)
    if not isinstance(raw, list):
        raise invalid_type("input", "a string or an array of input items", raw)
    if not raw:
        raise ApiError(
            400,
            "Invalid 'input': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            param="input",
            code="empty_array",
        )
    messages: list[ChatMessage] = []
    call_names: dict[str, str] = {}
    reasoning = ""
    """A reasoning item's text, for the assistant turn that follows it."""
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        fields = present(require_object(item, where))
        kind = read_str(fields, "type", where=f"{where}.type") or "message"
        if kind == "reasoning":
            reasoning += _reasoning_text(fields, where)
            continue
        if kind == "message":
            message = _parse_message(fields, where)
            if message.role == "assistant":
                message, reasoning = attrs.evolve(message, reasoning=reasoning), ""
            messages.append(message)
        elif kind == "function_call":
            call = _parse_function_call(fields, where)
            call_names[call.id] = call.name
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant" and not reasoning:
                messages[-1] = attrs.evolve(last, tool_calls=(*last.tool_calls, call))
            else:
                messages.append(
                    ChatMessage("assistant", "", tool_calls=(call,), reasoning=reasoning)
                )
                reasoning = ""
        elif kind == "function_call_output":
            call_id = required_str(fields, "call_id", where=f"{where}.call_id")
            if call_id not in call_names:
                raise invalid_value(
                    f"{where}.call_id",
                    f"no function call with call_id {call_id!r} comes before it in 'input'",
                )
            output = _text_of(
                required(fields, "output", where=f"{where}.output"), f"{where}.output"
            )
            messages.append(
                ChatMessage("tool", output, tool_call_id=call_id, name=call_names.get(call_id))
            )
        elif kind == "item_reference":
            raise ApiError(
                400,
                f"Unsupported input item type 'item_reference' in '{where}': {STATELESS}, so "
                "items cannot be referred to by id. Send the item itself.",
                param=f"{where}.type",
                code="unsupported_value",
            )
        else:
            raise ApiError(
                400,
                f"Unsupported input item type {kind!r} in '{where}': only 'message', "
                "'reasoning', 'function_call' and 'function_call_output' items are supported.",
                param=f"{where}.type",
                code="unsupported_value",
            )
    return tuple(messages)


def _parse_message(fields: Mapping[str, Any], where: str) -> ChatMessage:
    role = required_str(fields, "role", where=f"{where}.role")
    if role not in MESSAGE_ROLES:
        raise invalid_value(
            f"{where}.role",
            f"expected one of {', '.join(MESSAGE_ROLES)}, but got {role!r} instead",
        )
    text = _text_of(required(fields, "content", where=f"{where}.content"), f"{where}.content")
    return ChatMessage(ROLE_ALIASES.get(role, role), text)


def _reasoning_text(fields: Mapping[str, Any], where: str) -> str:
    """A replayed reasoning item's text: its `content` (or, without one, its `summary`)."""
    name = "content" if fields.get("content") else "summary"
    parts = fields.get(name) or []
    return text_content(parts, f"{where}.{name}", REASONING_TEXT_TYPES)


def _text_of(content: Any, where: str) -> str:
    """A string, or the concatenation of `input_text` / `output_text` parts."""
    return text_content(content, where, TEXT_PART_TYPES)


def _parse_function_call(fields: Mapping[str, Any], where: str) -> ToolCall:
    arguments = required_str(fields, "arguments", where=f"{where}.arguments")
    return ToolCall(
        id=required_str(fields, "call_id", where=f"{where}.call_id"),
        name=required_str(fields, "name", where=f"{where}.name"),
        arguments=arguments_text(arguments, f"{where}.arguments"),
    )


# --- tools and formats ---------------------------------------------------------------------


def _parse_tools(raw: Any) -> tuple[tuple[ToolSpec, ...], list[dict[str, Any]]]:
    """Flat function tools `{"type": "function", "name", ...}`, and their echo."""
    if not isinstance(raw, list):
        raise invalid_type("tools", "an array", raw)
    tools, echo = [], []
    for i, item in enumerate(raw):
        where = f"tools[{i}]"
        fields = present(require_object(item, where))
        require_function_type(fields, where)
        function = {name: value for name, value in fields.items() if name != "type"}
        tool = parse_function(function, where)
        strict = read_bool(fields, "strict", where=f"{where}.strict")
        tools.append(tool)
        echo.append(
            {
                "type": "function",
                "name": tool.name,
                "description": tool.description,
                "parameters": fields.get("parameters", {"type": "object", "properties": {}}),
                "strict": True if strict is None else strict,
            }
        )
    return check_tools(tools, "tools"), echo


def _parse_tool_choice(
    raw: Any, tools: tuple[ToolSpec, ...]
) -> tuple[ToolChoice, str | dict[str, Any]]:
    """A mode, or `{"type": "function", "name": ...}`; and its echo."""
    if raw is None:
        return ToolChoice(), "auto"
    if isinstance(raw, dict):
        fields = present(raw)
        require_function_type(fields, "tool_choice")
        for name in fields:
            if name not in ("type", "name"):
                raise unknown(f"tool_choice.{name}")
        name = required_str(fields, "name", where="tool_choice.name")
        choice = checked_tool_choice(ToolChoice("function", name), tools, "tool_choice")
        return choice, {"type": "function", "name": name}
    choice = checked_tool_choice(tool_choice_mode(raw, "tool_choice"), tools, "tool_choice")
    return choice, choice.mode


def _parse_text(raw: Any) -> tuple[ResponseFormat | None, dict[str, Any]]:
    """`text.format`: `{"type": "text" | "json_object"}` or `{"type": "json_schema", "name",
    "schema", "strict", "description"}`; and its echo."""
    if raw is None:
        return None, {"format": {"type": "text"}}
    fields = present(require_object(raw, "text"))
    for name in fields:
        if name not in TEXT_FIELDS:
            raise unknown(f"text.{name}")
    if "verbosity" in fields:
        raise unsupported("text.verbosity")
    if "format" not in fields:
        return None, {"format": {"type": "text"}}
    spec = present(require_object(fields["format"], "text.format"))
    kind = required_str(spec, "type", where="text.format.type")
    if kind in ("text", "json_object"):
        for name in spec:
            if name != "type":
                raise unknown(f"text.format.{name}")
        return (None if kind == "text" else ResponseFormat("json_object")), {"format": spec}
    if kind != "json_schema":
        raise invalid_value(
            "text.format.type",
            f"expected one of text, json_object, json_schema, but got {kind!r} instead",
        )
    schema_spec = {name: value for name, value in spec.items() if name != "type"}
    response_format = json_schema_format(schema_spec, "text.format")
    read_bool(spec, "strict", where="text.format.strict")
    return response_format, {"format": spec}


# --- accepted, checked, and otherwise ignored ----------------------------------------------


def _check_stream_options(fields: Mapping[str, Any], *, stream: bool) -> None:
    raw = fields.get("stream_options")
    if raw is None:
        return
    if not stream:
        raise invalid_value("stream_options", "only allowed when 'stream' is enabled")
    options = present(require_object(raw, "stream_options"))
    for name in options:
        if name not in STREAM_OPTIONS_FIELDS:
            raise unknown(f"stream_options.{name}")
    read_bool(options, "include_obfuscation", where="stream_options.include_obfuscation")


def _parse_reasoning(raw: Any) -> dict[str, Any]:
    """`reasoning`'s `effort` and `summary`, checked; as the response echoes them."""
    if raw is None:
        return {"effort": None, "summary": None}
    fields = present(require_object(raw, "reasoning"))
    for name in fields:
        if name not in REASONING_FIELDS:
            raise unknown(f"reasoning.{name}")
    summary = read_str(fields, "summary", where="reasoning.summary")
    summary = summary or read_str(fields, "generate_summary", where="reasoning.generate_summary")
    if summary is not None and summary not in REASONING_SUMMARIES:
        raise invalid_value(
            "reasoning.summary",
            f"expected one of {', '.join(REASONING_SUMMARIES)}, but got {summary!r} instead",
        )
    return {"effort": read_str(fields, "effort", where="reasoning.effort"), "summary": summary}


def _check_truncation(fields: Mapping[str, Any]) -> None:
    truncation = read_str(fields, "truncation")
    if truncation is None or truncation == "disabled":
        return
    if truncation == "auto":
        raise unsupported(
            "truncation", "trexo does not truncate input; a prompt over the context is a 400"
        )
    raise invalid_value(
        "truncation", f"expected one of auto, disabled, but got {truncation!r} instead"
    )


def _parse_metadata(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    metadata = require_object(raw, "metadata")
    if len(metadata) > MAX_METADATA_KEYS:
        raise invalid_value("metadata", f"expected at most {MAX_METADATA_KEYS} keys")
    for key, value in metadata.items():
        where = f"metadata.{key}"
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise invalid_value(where, f"keys are at most {MAX_METADATA_KEY_CHARS} characters")
        if not isinstance(value, str):
            raise invalid_type(where, "a string", value)
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise invalid_value(where, f"values are at most {MAX_METADATA_VALUE_CHARS} characters")
        valid_text(key, "metadata")
        valid_text(value, where)
    return dict(metadata)
