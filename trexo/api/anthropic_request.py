"""Parse and validate an Anthropic Messages request body (`POST /v1/messages`, and
`POST /v1/messages/count_tokens`). Pure: no I/O.

A request becomes one `GenerationRequest`: `system` (a string or text blocks) is the first
message; a user turn's `tool_result` blocks become `tool` messages answering the call they
name (`tool_call_id` = `tool_use_id`), its text the user message; an assistant turn's
`tool_use` blocks become its `ToolCall`s (arguments: the JSON text of `input`).

Choices where Anthropic's API and trexo differ:
- An absent `temperature` is trexo's greedy 0 (as in every dialect), not Anthropic's 1.0.
- Unknown fields are refused with a 400, everywhere in the body, as Anthropic does ("Extra
  inputs are not permitted"); `null` means absent. Fields that ask trexo for nothing it can
  act on are accepted and ignored: `metadata`, `service_tier`, `cache_control` (trexo's
  prompt cache is automatic), `inference_geo`, `speed`, `diagnostics`, `user_profile_id`,
  `workspace_id`, `output_config.effort`, a tool's `strict`. Server-side features (`container`,
  `mcp_servers`, `context_management`, server tools) are refused.
- `thinking` reaches the chat template as `enable_thinking` (`trexo.api.reasoning_request`):
  true for `enabled`, false for `disabled` or no `thinking` (Anthropic's default), the
  template's own default for `adaptive`. `budget_tokens` is checked as Anthropic checks it
  (>= 1024, below `max_tokens`) but not enforced: a model stops thinking when it does, and
  `max_tokens` bounds it all. A model that thinks anyway has its thinking returned as
  `thinking` blocks; `display: "omitted"` returns them empty. `output_config.effort` is the
  template's `reasoning_effort`.
- An assistant turn's `thinking` blocks are replayed to the chat template as its
  reasoning; `redacted_thinking` blocks (Anthropic's encrypted ones) are dropped, and no
  `signature` is checked.
- Several text blocks in one turn are joined with a blank line, so their words never run
  together in the single string a chat template takes.
- A `tool_result` with `is_error` reaches the model prefixed with `Error: ` (a chat
  template has no other way to say so).
- `output_config.format` (a JSON schema) constrains the output as OpenAI's
  `response_format` does.
- A last assistant turn (Anthropic's "prefill") is continued: the model goes on writing it,
  and the answer is what it adds (as Anthropic answers). One that ends in a `tool_use` is a
  finished turn.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any, Final, TypeVar

import attrs

from trexo.api.chat_request import MAX_TOKENS_LIMIT
from trexo.api.content import item_text, typed_items
from trexo.api.errors import ApiError
from trexo.api.reasoning_request import effort, template_kwargs_text, thinking
from trexo.api.tool_request import FUNCTION_NAME, check_tools, json_schema_format
from trexo.api.validation import (
    invalid_type,
    invalid_value,
    missing,
    present,
    read_bool,
    read_int,
    read_number,
    read_str,
    require_object,
    required,
    required_str,
    valid_text,
)
from trexo.types.generation import (
    ChatMessage,
    GenerationRequest,
    ResponseFormat,
    SamplingParams,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolSpec,
)
from trexo.types.ids import RequestId, new_id

MESSAGE_ID_PREFIX = "msg_"
MAX_STOP_SEQUENCES = 64
"""trexo's guard (Anthropic states no limit): each one is matched against every token."""
BLOCK_SEPARATOR = "\n\n"
TOOL_ERROR_PREFIX = "Error: "

IGNORED_FIELDS: Final = frozenset(
    {
        "metadata",
        "service_tier",
        "cache_control",
        "inference_geo",
        "speed",
        "diagnostics",
        "user_profile_id",
        "workspace_id",
    }
)
UNSUPPORTED_FIELDS: Final = frozenset({"container", "mcp_servers", "context_management"})
PROMPT_FIELDS: Final = frozenset(
    {"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config"}
)
"""What shapes the prompt: the fields `count_tokens` takes (with the ignored ones)."""
MESSAGES_FIELDS: Final = PROMPT_FIELDS | {
    "max_tokens",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
}

TEXT_FIELDS: Final = frozenset({"type", "text", "cache_control", "citations"})
TOOL_USE_FIELDS: Final = frozenset({"type", "id", "name", "input", "cache_control"})
THINKING_BLOCK_FIELDS: Final = frozenset({"type", "thinking", "signature", "cache_control"})
REDACTED_THINKING_FIELDS: Final = frozenset({"type", "data", "cache_control"})
TOOL_RESULT_FIELDS: Final = frozenset(
    {"type", "tool_use_id", "content", "is_error", "cache_control"}
)
TOOL_FIELDS: Final = frozenset(
    {"type", "name", "description", "input_schema", "cache_control", "strict"}
)
CUSTOM_TOOL = "custom"
TOOL_CHOICE_MODES: Final[Mapping[str, ToolChoiceMode]] = {
    "auto": "auto",
    "any": "required",
    "tool": "function",
    "none": "none",
}
THINKING_FIELDS: Final[Mapping[str, frozenset[str]]] = {
    "enabled": frozenset({"type", "budget_tokens", "display"}),
    "disabled": frozenset({"type"}),
    "adaptive": frozenset({"type", "display"}),
}
THINKING_SWITCH: Final[Mapping[str, bool | None]] = {
    "enabled": True,
    "disabled": False,
    "adaptive": None,
}
MIN_THINKING_BUDGET = 1024
"""Anthropic's least `thinking.budget_tokens`."""
THINKING_DISPLAYS: Final = ("summarized", "omitted")
EFFORTS: Final = ("low", "medium", "high", "xhigh", "max")

T = TypeVar("T")


@attrs.frozen
class MessagesRequest:
    """A validated Messages request."""

    model_id: str
    generation: GenerationRequest
    stream: bool
    requested_max_tokens: int
    """`max_tokens`, which Anthropic requires; admission checks it against the context."""
    show_thinking: bool = True
    """False: thinking blocks come empty (`thinking.display` "omitted")."""

    @property
    def message_id(self) -> RequestId:
        """The response's `id`, also the generation's request id (`POST /v1/cancel/{id}`)."""
        return self.generation.request_id


@attrs.frozen
class CountTokensRequest:
    """A validated `count_tokens` request: the prompt that would be generated from."""

    model_id: str
    generation: GenerationRequest


def new_message_id() -> RequestId:
    return RequestId(MESSAGE_ID_PREFIX + new_id())


def parse_messages_request(body: Any, request_id: RequestId | None = None) -> MessagesRequest:
    """Validate a decoded JSON body; raise a 400 `ApiError` on the first problem found.

    `request_id` defaults to a fresh `new_message_id()`.
    """
    fields = _checked_fields(body, MESSAGES_FIELDS)
    max_tokens = read_int(fields, "max_tokens", low=1, high=MAX_TOKENS_LIMIT)
    if max_tokens is None:
        raise missing("max_tokens")
    defaults = SamplingParams()
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=_or(
            read_number(fields, "temperature", low=0.0, high=1.0), defaults.temperature
        ),
        top_p=_or(read_number(fields, "top_p", low=0.0, high=1.0), defaults.top_p),
        top_k=_or(read_int(fields, "top_k", low=0), defaults.top_k),
        stop=_parse_stop_sequences(fields.get("stop_sequences")),
    )
    model_id, generation = _parse_prompt(fields, request_id or new_message_id(), max_tokens)
    return MessagesRequest(
        model_id=model_id,
        generation=attrs.evolve(generation, params=params),
        stream=read_bool(fields, "stream") or False,
        requested_max_tokens=max_tokens,
        show_thinking=_thinking_display(fields.get("thinking")) != "omitted",
    )


def parse_count_tokens_request(body: Any) -> CountTokensRequest:
    """Validate a `count_tokens` body: a Messages request without the sampling fields."""
    fields = _checked_fields(body, PROMPT_FIELDS)
    model_id, generation = _parse_prompt(fields, new_message_id())
    return CountTokensRequest(model_id, generation)


def _checked_fields(body: Any, allowed: frozenset[str]) -> dict[str, Any]:
    """The body's non-null fields, once none is unknown or asks for what trexo lacks."""
    fields = present(require_object(body))
    for name in fields:
        if name in UNSUPPORTED_FIELDS:
            raise ApiError(
                400,
                f"'{name}' is not supported by trexo: it serves models on your own machines, "
                "without Anthropic's server-side tools.",
                param=name,
                code="unsupported_parameter",
            )
        if name not in allowed and name not in IGNORED_FIELDS:
            raise extra_input(name)
    _check_metadata(fields.get("metadata"))
    return fields


def _parse_prompt(
    fields: Mapping[str, Any], request_id: RequestId, max_tokens: int | None = None
) -> tuple[str, GenerationRequest]:
    model_id = required_str(fields, "model")
    if not model_id:
        raise invalid_value("model", "expected a non-empty string")
    switches = _parse_thinking(fields.get("thinking"), max_tokens)
    response_format, effort_switch = _parse_output_config(fields.get("output_config"))
    switches.update(effort_switch)
    messages = _parse_messages(required(fields, "messages"))
    if "system" in fields:
        system = _text_of(fields["system"], "system")
        messages = (ChatMessage("system", system), *messages)
    tools = _parse_tools(fields["tools"]) if "tools" in fields else ()
    tool_choice, parallel = _parse_tool_choice(fields.get("tool_choice"), tools)
    return model_id, GenerationRequest(
        request_id=request_id,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        response_format=response_format,
        continue_final=messages[-1].role == "assistant" and not messages[-1].tool_calls,
        template_kwargs=template_kwargs_text(switches, "thinking"),
    )


# --- messages ----------------------------------------------------------------------------------


def _parse_messages(raw: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(raw, list):
        raise invalid_type("messages", "an array", raw)
    if not raw:
        raise invalid_value("messages", "expected at least one message")
    called: dict[str, str] = {}
    """Each earlier tool_use id -> its tool's name: a tool message names its function."""
    out: list[ChatMessage] = []
    for i, item in enumerate(raw):
        where = f"messages[{i}]"
        message = present(require_object(item, where))
        _check_keys(message, ("role", "content"), where)
        role = required_str(message, "role", where=f"{where}.role")
        content = required(message, "content", where=f"{where}.content")
        if role == "user":
            out += _user_turn(content, where, called)
        elif role == "assistant":
            turn = _assistant_turn(content, where)
            called.update((call.id, call.name) for call in turn.tool_calls)
            out.append(turn)
        elif role == "system":
            out.append(ChatMessage("system", _text_of(content, f"{where}.content")))
        else:
            raise invalid_value(
                f"{where}.role", f"expected one of user, assistant, system, but got {role!r}"
            )
    return tuple(out)


def _user_turn(content: Any, where: str, called: Mapping[str, str]) -> list[ChatMessage]:
    """A user turn: its tool results as `tool` messages and its text as a user message, in
    the order of its blocks."""
    if isinstance(content, str):
        return [ChatMessage("user", valid_text(content, f"{where}.content"))]
    out: list[ChatMessage] = []
    texts: list[str] = []
    for at, kind, block in typed_items(content, f"{where}.content", ("text", "tool_result")):
        if kind == "text":
            texts.append(_text_block(block, at))
            continue
        if texts:
            out.append(ChatMessage("user", BLOCK_SEPARATOR.join(texts)))
            texts = []
        out.append(_tool_result(block, at, called))
    if texts or not out:
        out.append(ChatMessage("user", BLOCK_SEPARATOR.join(texts)))
    return out


def _assistant_turn(content: Any, where: str) -> ChatMessage:
    if isinstance(content, str):
        return ChatMessage("assistant", valid_text(content, f"{where}.content"))
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    kinds = ("text", "tool_use", "thinking", "redacted_thinking")
    for at, kind, block in typed_items(content, f"{where}.content", kinds):
        if kind == "text":
            texts.append(_text_block(block, at))
        elif kind == "thinking":
            _check_keys(block, THINKING_BLOCK_FIELDS, at)
            read_str(block, "signature", where=f"{at}.signature")
            thoughts.append(valid_text(required_str(block, "thinking", where=f"{at}.thinking"), at))
        elif kind == "redacted_thinking":
            _check_keys(block, REDACTED_THINKING_FIELDS, at)
        else:
            calls.append(_tool_use(block, at))
    return ChatMessage(
        "assistant",
        BLOCK_SEPARATOR.join(texts),
        tool_calls=tuple(calls),
        reasoning=BLOCK_SEPARATOR.join(thoughts),
    )


def _text_block(block: Mapping[str, Any], where: str) -> str:
    _check_keys(block, TEXT_FIELDS, where)
    return item_text(block, where)


def _text_of(content: Any, where: str) -> str:
    """A string, or the text of an array of text blocks (`system`, a tool result)."""
    if isinstance(content, str):
        return valid_text(content, where)
    blocks = typed_items(content, where, ("text",))
    return BLOCK_SEPARATOR.join(_text_block(block, at) for at, _, block in blocks)


def _tool_use(block: Mapping[str, Any], where: str) -> ToolCall:
    _check_keys(block, TOOL_USE_FIELDS, where)
    call_id = required_str(block, "id", where=f"{where}.id")
    if not call_id:
        raise invalid_value(f"{where}.id", "expected a non-empty string")
    arguments = require_object(required(block, "input", where=f"{where}.input"), f"{where}.input")
    return ToolCall(
        id=valid_text(call_id, f"{where}.id"),
        name=valid_text(required_str(block, "name", where=f"{where}.name"), f"{where}.name"),
        arguments=valid_text(json.dumps(arguments, ensure_ascii=False), f"{where}.input"),
    )


def _tool_result(block: Mapping[str, Any], where: str, called: Mapping[str, str]) -> ChatMessage:
    _check_keys(block, TOOL_RESULT_FIELDS, where)
    call_id = required_str(block, "tool_use_id", where=f"{where}.tool_use_id")
    text = _text_of(block.get("content", ""), f"{where}.content")
    if read_bool(block, "is_error", where=f"{where}.is_error"):
        text = TOOL_ERROR_PREFIX + text
    return ChatMessage("tool", text, tool_call_id=call_id, name=called.get(call_id))


# --- tools -------------------------------------------------------------------------------------


def _parse_tools(raw: Any) -> tuple[ToolSpec, ...]:
    if not isinstance(raw, list):
        raise invalid_type("tools", "an array", raw)
    return check_tools([_parse_tool(item, f"tools[{i}]") for i, item in enumerate(raw)], "tools")


def _parse_tool(raw: Any, where: str) -> ToolSpec:
    tool = present(require_object(raw, where))
    kind = read_str(tool, "type", where=f"{where}.type")
    if kind not in (None, CUSTOM_TOOL):
        raise ApiError(
            400,
            f"Tools of type {kind!r} in '{where}' are Anthropic's server tools, which trexo "
            "does not have: only client tools (`name`, `description`, `input_schema`) are "
            "supported.",
            param=f"{where}.type",
            code="unsupported_value",
        )
    _check_keys(tool, TOOL_FIELDS, where)
    name = required_str(tool, "name", where=f"{where}.name")
    if not FUNCTION_NAME.fullmatch(name):
        raise invalid_value(f"{where}.name", f"{name!r} does not match '^[a-zA-Z0-9_-]{{1,64}}$'")
    description = read_str(tool, "description", where=f"{where}.description")
    if description is not None:
        valid_text(description, f"{where}.description")
    read_bool(tool, "strict", where=f"{where}.strict")
    schema = require_object(
        required(tool, "input_schema", where=f"{where}.input_schema"), f"{where}.input_schema"
    )
    if schema.get("type") != "object":
        raise invalid_value(f"{where}.input_schema.type", "expected 'object'")
    return ToolSpec(name, description, json.dumps(schema, ensure_ascii=False))


def _parse_tool_choice(raw: Any, tools: tuple[ToolSpec, ...]) -> tuple[ToolChoice, bool]:
    """The tool choice, and whether several calls may be made at once."""
    if raw is None:
        return ToolChoice(), True
    fields = present(require_object(raw, "tool_choice"))
    kind = required_str(fields, "type", where="tool_choice.type")
    if kind not in TOOL_CHOICE_MODES:
        raise invalid_value(
            "tool_choice.type",
            f"expected one of {', '.join(TOOL_CHOICE_MODES)}, but got {kind!r} instead",
        )
    allowed = {"type"} | ({"name"} if kind == "tool" else set())
    if kind != "none":
        allowed.add("disable_parallel_tool_use")
    _check_keys(fields, allowed, "tool_choice")
    disable = read_bool(
        fields, "disable_parallel_tool_use", where="tool_choice.disable_parallel_tool_use"
    )
    name = required_str(fields, "name", where="tool_choice.name") if kind == "tool" else None
    choice = ToolChoice(TOOL_CHOICE_MODES[kind], name)
    if choice.mode in ("required", "function") and not tools:
        raise invalid_value("tool_choice", "only allowed when 'tools' are specified")
    if choice.mode == "function" and name not in {tool.name for tool in tools}:
        raise invalid_value("tool_choice.name", f"no tool named {name!r} is among 'tools'")
    return choice, not disable


# --- the rest ----------------------------------------------------------------------------------


def _parse_thinking(raw: Any, max_tokens: int | None) -> dict[str, Any]:
    """The template switch `thinking` asks for (none: thinking off, as Anthropic's default)."""
    if raw is None:
        return thinking(False)
    fields = present(require_object(raw, "thinking"))
    kind = required_str(fields, "type", where="thinking.type")
    if kind not in THINKING_FIELDS:
        raise invalid_value(
            "thinking.type", f"expected one of {', '.join(THINKING_FIELDS)}, but got {kind!r}"
        )
    _check_keys(fields, THINKING_FIELDS[kind], "thinking")
    _thinking_display(fields)
    if kind == "enabled":
        where = "thinking.budget_tokens"
        budget = read_int({where: fields.get("budget_tokens")}, where, low=MIN_THINKING_BUDGET)
        if budget is None:
            raise missing("thinking.budget_tokens")
        if max_tokens is not None and budget >= max_tokens:
            raise invalid_value(
                "max_tokens", "`max_tokens` must be greater than `thinking.budget_tokens`"
            )
    return thinking(THINKING_SWITCH[kind])


def _thinking_display(raw: Any) -> str | None:
    if not isinstance(raw, dict):
        return None
    display = read_str(raw, "display", where="thinking.display")
    if display is not None and display not in THINKING_DISPLAYS:
        raise invalid_value(
            "thinking.display",
            f"expected one of {', '.join(THINKING_DISPLAYS)}, but got {display!r}",
        )
    return display


def _parse_output_config(raw: Any) -> tuple[ResponseFormat | None, dict[str, Any]]:
    """The response format, and the template switch for the effort."""
    if raw is None:
        return None, {}
    fields = present(require_object(raw, "output_config"))
    _check_keys(fields, ("effort", "format"), "output_config")
    effort_at = "output_config.effort"
    switch = effort(read_str(fields, "effort", where=effort_at), effort_at, EFFORTS)
    if "format" not in fields:
        return None, switch
    where = "output_config.format"
    spec = present(require_object(fields["format"], where))
    _check_keys(spec, ("type", "schema"), where)
    kind = required_str(spec, "type", where=f"{where}.type")
    if kind != "json_schema":
        raise invalid_value(f"{where}.type", f"expected 'json_schema', but got {kind!r}")
    schema = required(spec, "schema", where=f"{where}.schema")
    return json_schema_format({"name": "output", "schema": schema}, where), switch


def _parse_stop_sequences(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise invalid_type("stop_sequences", "an array of strings", raw)
    if len(raw) > MAX_STOP_SEQUENCES:
        raise invalid_value(
            "stop_sequences", f"expected at most {MAX_STOP_SEQUENCES}, but got {len(raw)}"
        )
    for i, stop in enumerate(raw):
        where = f"stop_sequences[{i}]"
        if not isinstance(stop, str):
            raise invalid_type(where, "a string", stop)
        if not stop:
            raise invalid_value(where, "a stop sequence must not be empty")
        valid_text(stop, where)
    return tuple(raw)


def _check_metadata(raw: Any) -> None:
    if raw is None:
        return
    fields = present(require_object(raw, "metadata"))
    _check_keys(fields, ("user_id",), "metadata")
    read_str(fields, "user_id", where="metadata.user_id")


def _check_keys(fields: Mapping[str, Any], allowed: Collection[str], where: str) -> None:
    for name in fields:
        if name not in allowed:
            raise extra_input(f"{where}.{name}")


def _or(value: T | None, default: T) -> T:
    return default if value is None else value


# --- errors, worded as Anthropic's ---------------------------------------------------------


def extra_input(param: str) -> ApiError:
    return ApiError(
        400, f"{param}: Extra inputs are not permitted", param=param, code="unknown_parameter"
    )
