# ruff: noqa: RUF001, RUF002, RUF003  (the fullwidth bars are DeepSeek's own tokens)
"""DeepSeek V3 / R1 / V3.1 tool calls.

Calls are written between `<｜tool▁calls▁begin｜>` and `<｜tool▁calls▁end｜>`, each
between `<｜tool▁call▁begin｜>` and `<｜tool▁call▁end｜>`. V3 and R1 write a call as
`function<｜tool▁sep｜>NAME` then the arguments in a json code block; V3.1 writes
`NAME<｜tool▁sep｜>ARGUMENTS`. Both are read (as vLLM's `deepseek_v3` and `deepseek_v31`
parsers do).

V3's and R1's own templates render a replayed call only in a turn whose content is None
(`message['content'] is none`), and transformers 5's `apply_chat_template` drops the keys
whose value is None before rendering, so there such a turn renders as an empty answer: the
call is not shown to the model again (its result is). V3.1's template tests `tool_calls`.
"""

from __future__ import annotations

import json
from typing import Any

tool_call_start = "<｜tool▁calls▁begin｜>"
tool_call_end = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEPARATOR = "<｜tool▁sep｜>"
FENCE = "```"
replayed_arguments_as_text = True
"""Its templates concatenate a replayed call's arguments to a string: they are given the
arguments' JSON text, not the object most templates render with `tojson`."""


def parse_tool_call(text: str, tools: Any = None) -> dict[str, Any] | list[dict[str, Any]]:
    calls = [_call(part.split(CALL_END, 1)[0]) for part in text.split(CALL_BEGIN)[1:]]
    if not calls:
        raise ValueError("No function provided.")
    return calls[0] if len(calls) == 1 else calls


def _call(text: str) -> dict[str, Any]:
    head, separator, body = text.partition(SEPARATOR)
    if not separator:
        raise ValueError(f"a call without {SEPARATOR}: {text!r}")
    if FENCE in body:  # V3: function<｜tool▁sep｜>NAME\n```json\nARGUMENTS\n```
        name, _, block = body.partition("\n")
        arguments = block.strip().removeprefix(FENCE + "json").removeprefix(FENCE)
        arguments = arguments.removesuffix(FENCE)
    else:  # V3.1: NAME<｜tool▁sep｜>ARGUMENTS
        name, arguments = head, body
    return {"name": name.strip(), "arguments": json.loads(arguments)}
