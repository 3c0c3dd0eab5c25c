"""Cohere Command R7B / Command A tool calls (their `tool_use` chat template).

Every turn of these models is sectioned by markers: `<|START_THINKING|>` ... `<|END_THINKING|>`
is its plan (reasoning), `<|START_RESPONSE|>` ... `<|END_RESPONSE|>` its answer, and
`<|START_ACTION|>` ... `<|END_ACTION|>` a JSON list of calls, each
`{"tool_call_id": "0", "tool_name": NAME, "parameters": {...}}`. Text outside a section is
dropped. `RESPONSE_FORMAT` gives these edges (`trexo.engine.tool_parsers.sections`).
"""

from __future__ import annotations

import json
from typing import Any

from trexo.engine.tool_parsers.sections import sectioned

tool_call_start = "<|START_ACTION|>"
tool_call_end = "<|END_ACTION|>"

RESPONSE_FORMAT = sectioned(
    reasoning=("<|START_THINKING|>", "<|END_THINKING|>"),
    answers=("<|START_RESPONSE|>",),
    answer_end="<|END_RESPONSE|>",
    call=tool_call_start,
)


def parse_tool_call(text: str, tools: Any = None) -> list[dict[str, Any]]:
    calls = json.loads(text)
    if not isinstance(calls, list) or not calls:
        raise ValueError(f"an action is a non-empty list of calls: {text!r}")
    return [{"name": call["tool_name"], "arguments": call.get("parameters", {})} for call in calls]
