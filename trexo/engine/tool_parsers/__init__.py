"""Tool-call parsers for the model families mlx-lm has none for, in mlx-lm's parser interface.

Each module is shaped like mlx-lm's `mlx_lm.tool_parsers.*`: `tool_call_start`,
`tool_call_end` and `parse_tool_call(text, tools)`. A few formats need more, as optional
module attributes:

- `bare_call_start`: a call may be written with no marker, as the whole answer beginning
  with this (Llama 3's JSON, Gemma's list, Phi-4-mini's `functools[`); `forcible = False`
  where no marker can start a forced call;
- `RESPONSE_FORMAT`: every message opens with a header naming its section (gpt-oss's
  harmony, Command R7B; `sections`);
- `replayed_arguments_as_text`: the template concatenates a replayed call's arguments as a
  string (DeepSeek's) instead of rendering the object with `tojson`;
- `template_messages(messages, tools)`: the template renders no tools, calls or results
  of its own (Gemma 2 / 3, Phi-4-mini), so the messages carry them.

`infer_tool_parser` picks one from the model's chat template, the way mlx-lm's
`_infer_tool_parser` does, and is asked only when mlx-lm's finds nothing.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import attrs

from trexo.engine.tool_parsers import (
    command_r,
    command_r7b,
    deepseek_v3,
    gemma,
    harmony,
    llama3_json,
    phi4_mini,
)

LLAMA3_FORMAT_SENTENCE = '{"name": function name, "parameters": dictionary of argument name'
"""The format Meta's Llama 3.1 / 3.2 / 3.3 templates ask calls in."""


def infer_tool_parser(chat_template: Any) -> ModuleType | None:
    """The parser module for the tool calls `chat_template` asks for; None if it asks none
    this package knows (a template with no tools at all: Llama 3.0, Phi-3.5, Phi-4)."""
    if isinstance(chat_template, dict):  # named templates (Cohere's: default, tool_use, rag)
        chat_template = "".join(t for t in chat_template.values() if isinstance(t, str))
    if not isinstance(chat_template, str):
        return None
    if deepseek_v3.tool_call_start in chat_template:
        return deepseek_v3
    if "<|channel|>commentary" in chat_template and harmony.tool_call_end in chat_template:
        return harmony
    if LLAMA3_FORMAT_SENTENCE in chat_template:
        return llama3_json
    if command_r7b.tool_call_start in chat_template:
        return command_r7b
    if "Action:" in chat_template and '"tool_name"' in chat_template:
        return command_r
    if "message['tools']" in chat_template and "<|tool|>" in chat_template:
        return phi4_mini
    if "<start_of_turn>" in chat_template and "tools" not in chat_template:
        return gemma  # Gemma 2 / 3: no tools of its own (mlx-lm knows Gemma 4's)
    return None


@attrs.frozen
class ToolFormat:
    """How a model writes calls: its markers and the parser for what is between them
    (mlx-lm's, or `trexo.engine.tool_parsers`' for the families mlx-lm has none for)."""

    start: str
    end: str
    parser: Any
    """`parse_tool_call(text, tools) -> dict | list[dict]` of an mlx-lm tool parser."""
    bare_start: str = ""
    """A call may also be written with no marker, as the whole answer beginning with this
    (Llama 3's JSON: `{`); such a call is parsed when the output ends."""
    forcible: bool = True
    """A forced call can be started by ending the prompt with `start` (not where the
    marker is not how the model usually starts a call)."""

    @classmethod
    def of(cls, tokenizer: Any) -> ToolFormat | None:
        """The format of mlx-lm's `TokenizerWrapper`, else the one its chat template asks
        for (`trexo.engine.tool_parsers`); None if neither knows of one."""
        if getattr(tokenizer, "has_tool_calling", False):
            return cls(
                tokenizer.tool_call_start, tokenizer.tool_call_end or "", tokenizer.tool_parser
            )
        family = tool_family(tokenizer)
        if family is None:
            return None
        return cls(
            family.tool_call_start,
            family.tool_call_end,
            family.parse_tool_call,
            getattr(family, "bare_call_start", ""),
            getattr(family, "forcible", True),
        )


def tool_family(tokenizer: Any) -> ModuleType | None:
    """The parser module of `tokenizer`'s template, when mlx-lm knows of no tool format."""
    if getattr(tokenizer, "has_tool_calling", False):
        return None
    return infer_tool_parser(getattr(tokenizer, "chat_template", None))
