"""Llama 3.1 / 3.2 / 3.3 JSON tool calls.

Meta's templates ask for `{"name": function name, "parameters": dictionary of argument
name and its value}` as the whole answer; the model writes it bare (Llama 3.2, 3.3) or after
`<|python_tag|>` (Llama 3.1, whose tag also opens built-in tools' code). Several calls are
objects separated by `;`, as vLLM's `llama3_json` parser reads them. A bare call has no start
marker: it is recognised by the answer's first character (`bare_call_start`).
"""

from __future__ import annotations

import json
from typing import Any

tool_call_start = "<|python_tag|>"
tool_call_end = ""
bare_call_start = "{"
"""A call may also be the whole answer, beginning with this (no marker at all)."""
forcible = False
"""A forced call is not started with `<|python_tag|>`: Llama 3.2 and 3.3 never write it
before JSON, and the bare `{` would split the model's own `{"` token."""


def parse_tool_call(text: str, tools: Any = None) -> dict[str, Any] | list[dict[str, Any]]:
    decoder = json.JSONDecoder()
    calls: list[dict[str, Any]] = []
    position = 0
    while True:
        while position < len(text) and (text[position].isspace() or text[position] == ";"):
            position += 1
        if position == len(text):
            break
        item, position = decoder.raw_decode(text, position)
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValueError(f"not a call: {item!r}")
        arguments = item.get("parameters", item.get("arguments", {}))
        calls.append({"name": item["name"], "arguments": arguments})
    if not calls:
        raise ValueError("No function provided.")
    return calls[0] if len(calls) == 1 else calls
