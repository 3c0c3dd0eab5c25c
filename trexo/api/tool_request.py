"""Tools, tool choices and response formats in requests: the parts the OpenAI-style dialects
share. Pure: no I/O; problems raise a 400 `ApiError` naming the parameter."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

from trexo.api.errors import ApiError
from trexo.api.validation import (
    invalid_type,
    invalid_value,
    present,
    read_str,
    require_object,
    required,
    required_str,
    unknown,
    valid_text,
)
from trexo.types.generation import ResponseFormat, ToolCall, ToolChoice, ToolSpec

FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""OpenAI's rule for function names."""
MAX_TOOLS = 128
"""OpenAI's limit on `tools`."""
TOOL_CHOICE_MODES: Final = ("none", "auto", "required")
FUNCTION_FIELDS: Final = frozenset({"name", "description", "parameters", "strict"})


def parse_function(raw: Any, where: str, *, extra: frozenset[str] = frozenset()) -> ToolSpec:
    """A function's `name`, `description` and `parameters` (a JSON Schema object)."""
    fields = present(require_object(raw, where))
    for name in fields:
        if name not in FUNCTION_FIELDS | extra:
            raise unknown(f"{where}.{name}")
    name = required_str(fields, "name", where=f"{where}.name")
    if not FUNCTION_NAME.fullmatch(name):
        raise invalid_value(
            f"{where}.name",
            f"{name!r} does not match '^[a-zA-Z0-9_-]{{1,64}}$'",
        )
    description = read_str(fields, "description", where=f"{where}.description")
    if description is not None:
        valid_text(description, f"{where}.description")
    parameters = fields.get("parameters", {"type": "object", "properties": {}})
    require_object(parameters, f"{where}.parameters")
    return ToolSpec(name, description, json.dumps(parameters, ensure_ascii=False))


def check_tools(tools: list[ToolSpec], param: str) -> tuple[ToolSpec, ...]:
    if len(tools) > MAX_TOOLS:
        raise invalid_value(param, f"expected at most {MAX_TOOLS} tools, but got {len(tools)}")
    names = [tool.name for tool in tools]
    if len(set(names)) != len(names):
        raise invalid_value(param, "two tools have the same name")
    return tuple(tools)


def parse_chat_tools(raw: Any, param: str = "tools") -> tuple[ToolSpec, ...]:
    """Chat Completions' `tools`: `[{"type": "function", "function": {...}}]`."""
    if not isinstance(raw, list):
        raise invalid_type(param, "an array", raw)
    tools = []
    for i, item in enumerate(raw):
        where = f"{param}[{i}]"
        fields = present(require_object(item, where))
        require_function_type(fields, where)
        for name in fields:
            if name not in ("type", "function"):
                raise unknown(f"{where}.{name}")
        tools.append(
            parse_function(
                required(fields, "function", where=f"{where}.function"), f"{where}.function"
            )
        )
    return check_tools(tools, param)


def require_function_type(fields: Mapping[str, Any], where: str) -> None:
    kind = required_str(fields, "type", where=f"{where}.type")
    if kind != "function":
        raise ApiError(
            400,
            f"Unsupported tool type {kind!r} in '{where}': only 'function' tools are supported.",
            param=f"{where}.type",
            code="unsupported_value",
        )


def parse_chat_tool_choice(raw: Any, tools: tuple[ToolSpec, ...]) -> ToolChoice:
    """Chat Completions' `tool_choice`: a mode, or `{"type": "function", "function":
    {"name": ...}}`."""
    if raw is None:
        return ToolChoice()
    if isinstance(raw, dict):
        fields = present(raw)
        require_function_type(fields, "tool_choice")
        function = present(
            require_object(
                required(fields, "function", where="tool_choice.function"), "tool_choice.function"
            )
        )
        name = required_str(function, "name", where="tool_choice.function.name")
        return checked_tool_choice(ToolChoice("function", name), tools, "tool_choice")
    return checked_tool_choice(tool_choice_mode(raw, "tool_choice"), tools, "tool_choice")


def tool_choice_mode(raw: Any, param: str) -> ToolChoice:
    if not isinstance(raw, str):
        raise invalid_type(param, "a string or an object", raw)
    if raw not in TOOL_CHOICE_MODES:
        raise invalid_value(
            param, f"expected one of {', '.join(TOOL_CHOICE_MODES)}, but got {raw!r} instead"
        )
    return ToolChoice(raw)  # type: ignore[arg-type]


def checked_tool_choice(choice: ToolChoice, tools: tuple[ToolSpec, ...], param: str) -> ToolChoice:
    """`choice`, if it can be honoured with `tools`."""
    if choice.mode != "none" and not tools:
        raise invalid_value(param, "only allowed when 'tools' are specified")
    if choice.mode == "function" and choice.function not in {tool.name for tool in tools}:
        raise invalid_value(param, f"no tool named {choice.function!r} is among 'tools'")
    return choice


def parse_tool_calls(raw: Any, where: str) -> tuple[ToolCall, ...]:
    """An assistant message's `tool_calls` in Chat Completions' shape."""
    if not isinstance(raw, list):
        raise invalid_type(where, "an array", raw)
    calls = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        fields = present(require_object(item, at))
        require_function_type(fields, at)
        function = present(
            require_object(required(fields, "function", where=f"{at}.function"), f"{at}.function")
        )
        calls.append(
            ToolCall(
                id=required_str(fields, "id", where=f"{at}.id"),
                name=required_str(function, "name", where=f"{at}.function.name"),
                arguments=arguments_text(
                    required_str(function, "arguments", where=f"{at}.function.arguments"),
                    f"{at}.function.arguments",
                ),
            )
        )
    return tuple(calls)


def arguments_text(text: str, where: str) -> str:
    """A call's arguments: JSON text of an object, as the model wrote them."""
    valid_text(text, where)
    try:
        value = json.loads(text)
    except ValueError:
        raise invalid_value(where, "expected the arguments as JSON text of an object") from None
    if not isinstance(value, dict):
        raise invalid_value(where, "expected the arguments as JSON text of an object")
    return text


def parse_response_format(raw: Any, param: str = "response_format") -> ResponseFormat | None:
    """`{"type": "text" | "json_object"}` or `{"type": "json_schema", "json_schema": {...}}`."""
    if raw is None:
        return None
    fields = present(require_object(raw, param))
    kind = required_str(fields, "type", where=f"{param}.type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object")
    if kind != "json_schema":
        raise invalid_value(
            f"{param}.type",
            f"expected one of text, json_object, json_schema, but got {kind!r} instead",
        )
    spec = present(
        require_object(
            required(fields, "json_schema", where=f"{param}.json_schema"), f"{param}.json_schema"
        )
    )
    return json_schema_format(spec, f"{param}.json_schema")


def json_schema_format(spec: Mapping[str, Any], where: str) -> ResponseFormat:
    """A `{"name", "schema", "strict", "description"}` object as a response format."""
    for name in spec:
        if name not in ("name", "schema", "strict", "description"):
            raise unknown(f"{where}.{name}")
    required_str(spec, "name", where=f"{where}.name")
    schema = require_object(spec.get("schema", {}), f"{where}.schema")
    # Compiled later, bounded, off the event loop (`trexo.api.views.admit_generation`).
    return ResponseFormat("json_schema", json.dumps(schema, ensure_ascii=False))
