"""Gemma 2 / 3 tool calls: a Python list of calls, which trexo shows the model itself.

Gemma 2 and 3 have no tool format: their chat templates render no tools, no calls and no tool
turns (and refuse any order of roles but user and model alternating). What Google's Gemma 3
function-calling guide uses is chosen, as vLLM's `pythonic` parser and its Gemma 3 template
do: the tools, as JSON, and the instruction to answer with a Python list of calls and
nothing else, `[get_weather(city="Paris")]`, open the first user turn; a replayed call is
its model turn's text in that form; results go back as a user turn, each in a `tool_output`
code block. (A call in a `tool_code` code block, which some Gemma prompts ask for, is read
too.) Calls are parsed with mlx-lm's own `pythonic` parser.

The answer is a call when it begins with `[`, so it is held until it ends; a forced call
cannot be started (the bracket would split the model's own tokens).
"""

from __future__ import annotations

import json
from typing import Any

tool_call_start = "```tool_code"
tool_call_end = "```"
bare_call_start = "["
forcible = False

TOOLS_PREAMBLE = (
    "You have access to functions. If you decide to invoke any of the function(s),\n"
    "you MUST put it in the format of\n"
    "[func_name1(params_name1=params_value1, params_name2=params_value2...), "
    "func_name2(params)]\n\n"
    "You SHOULD NOT include any other text in the response if you call a function\n"
)
"""Google's words (Gemma 3 function calling guide), before the tools' JSON."""
RESULT_BLOCK = "```tool_output\n{}\n```"


def parse_tool_call(text: str, tools: Any = None) -> dict[str, Any] | list[dict[str, Any]]:
    text = text.strip()
    if not text.startswith("["):  # a tool_code block's bare call
        text = f"[{text}]"
    # Imported here, not with the module: importing the `mlx_lm` package sets the process's
    # descriptor limits (and fails where the hard limit is under 4096), and the node imports
    # this module at start; only a runner parses calls.
    from mlx_lm.tool_parsers import pythonic

    parsed: dict[str, Any] | list[dict[str, Any]] = pythonic.parse_tool_call(text, tools)
    return parsed


def template_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """`messages` as Gemma's template can render them: tools in the first user turn, calls
    as their model turn's text, results as user turns."""
    out: list[dict[str, Any]] = []
    after_result = False
    for message in messages:
        message = dict(message)
        if message["role"] == "tool":
            block = RESULT_BLOCK.format(message["content"])
            if after_result:  # consecutive results share one turn
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
            after_result = True
            continue
        after_result = False
        if calls := message.pop("tool_calls", None):
            written = "[" + ", ".join(_call_text(call["function"]) for call in calls) + "]"
            message["content"] = "\n".join(filter(None, (message["content"], written)))
        out.append(message)
    if tools:
        first = next((m for m in out if m["role"] == "user"), None)
        if first is not None:
            listed = json.dumps([tool["function"] for tool in tools], indent=2)
            first["content"] = f"{TOOLS_PREAMBLE}{listed}\n\n{first['content']}"
    return out


def _call_text(function: dict[str, Any]) -> str:
    arguments = function["arguments"]
    if isinstance(arguments, dict):
        arguments = ", ".join(f"{key}={json.dumps(value)}" for key, value in arguments.items())
    return f"{function['name']}({arguments})"
