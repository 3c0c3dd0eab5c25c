"""Cohere Command R / R+ (v01, 08-2024) tool calls (their `tool_use` chat template).

The template ends every prompt asking for `Action:` and a json code block with a list of
`{"tool_name": NAME, "parameters": {...}}`; the model's turn ends after it, so there is no end
marker and the call is parsed when the output ends. An action naming `directly-answer` (the
template's own pseudo-tool, never offered by a client) is no call: it comes back as text.
Command R7B and Command A write `<|START_ACTION|>` instead (`command_r7b`).
"""

from __future__ import annotations

from typing import Any

from trexo.engine.tool_parsers.command_r7b import parse_tool_call as parse_actions

tool_call_start = "Action:"
tool_call_end = ""
FENCE = "```"


def parse_tool_call(text: str, tools: Any = None) -> list[dict[str, Any]]:
    block = text.strip().removeprefix(FENCE + "json").removeprefix(FENCE).removesuffix(FENCE)
    return parse_actions(block, tools)
