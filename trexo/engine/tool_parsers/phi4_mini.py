"""Phi-4-mini tool calls.

Phi-4-mini's template takes no `tools` variable: it renders a system message's `tools` field,
a string, between `<|tool|>` and `<|/tool|>`, and renders every other turn as
`<|role|>content<|end|>`. So the tools go there, as the JSON list of functions Microsoft's
model card shows (`template_messages`); a replayed call is its assistant turn's text, and a
result a `<|tool_response|>` turn (the vocabulary's own markers, as llama.cpp renders them).
The model writes a JSON list of `{"name": ..., "arguments": {...}}` between `<|tool_call|>`
and `<|/tool_call|>`, or after `functools` (the format of vLLM's Phi-4-mini template, written
by Microsoft); both are read. Phi-3.5 and Phi-4 templates have no tools at all.
"""

from __future__ import annotations

import json
from typing import Any

tool_call_start = "<|tool_call|>"
tool_call_end = "<|/tool_call|>"
bare_call_start = "functools["
forcible = True
"""A forced call starts with `<|tool_call|>` (`bare_call_start` is the other convention)."""
SYSTEM = "You are a helpful assistant with some tools."
"""The system message of Microsoft's tool-calling example, when a request has none."""


def parse_tool_call(text: str, tools: Any = None) -> dict[str, Any] | list[dict[str, Any]]:
    parsed = json.loads(text.strip().removeprefix("functools"))
    calls = parsed if isinstance(parsed, list) else [parsed]
    if not calls:
        raise ValueError("No function provided.")
    found = [{"name": call["name"], "arguments": call.get("arguments", {})} for call in calls]
    return found[0] if len(found) == 1 else found


def template_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """`messages` as Phi-4-mini's template can render them: tools in the system message's
    `tools` field, calls as their turn's text, results as `tool_response` turns."""
    out: list[dict[str, Any]] = []
    for message in messages:
        message = dict(message)
        if message["role"] == "tool":
            message = {"role": "tool_response", "content": message["content"]}
        elif calls := message.pop("tool_calls", None):
            written = json.dumps([_call(call["function"]) for call in calls], ensure_ascii=False)
            message["content"] += tool_call_start + written + tool_call_end
        out.append(message)
    if tools:
        if not out or out[0]["role"] != "system":
            out.insert(0, {"role": "system", "content": SYSTEM})
        out[0]["tools"] = json.dumps([tool["function"] for tool in tools], ensure_ascii=False)
    return out


def _call(function: dict[str, Any]) -> dict[str, Any]:
    return {"name": function["name"], "arguments": function["arguments"]}
