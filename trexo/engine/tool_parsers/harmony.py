"""gpt-oss (OpenAI harmony) output: channels and tool calls.

Every message the model writes has a header, then `<|message|>`: `<|channel|>analysis` is its
reasoning, `<|channel|>final` (or a `commentary` preamble) its answer, and a header naming a
recipient ` to=functions.NAME` (before or after the channel) is a call, whose JSON arguments
follow `<|message|>` and end with `<|call|>` (an end-of-sequence token in gpt-oss's
`generation_config.json`). `<|end|>` closes a message; the next one starts with a header again.

`RESPONSE_FORMAT` gives these edges (`trexo.engine.tool_parsers.sections`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from trexo.engine.tool_parsers.sections import sectioned

tool_call_start = " to=functions."
tool_call_end = "<|call|>"
MESSAGE = "<|message|>"
END = "<|end|>"

RESPONSE_FORMAT = sectioned(
    reasoning=("<|channel|>analysis<|message|>", END),
    answers=("<|channel|>final<|message|>", "<|channel|>commentary<|message|>"),
    answer_end=END,
    call=tool_call_start,
)


_NAME = re.compile(r"[\w.\-]+")


def parse_tool_call(text: str, tools: Any = None) -> dict[str, Any]:
    """`NAME<|channel|>commentary json<|message|>ARGUMENTS` (or `NAME <|constrain|>json...`)."""
    name = _NAME.match(text)
    _, found, arguments = text.partition(MESSAGE)
    if name is None or not found:
        raise ValueError(f"not a harmony call: {text!r}")
    return {"name": name.group(), "arguments": json.loads(arguments or "{}")}
