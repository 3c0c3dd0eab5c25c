# ruff: noqa: RUF001, RUF003  (the fullwidth bars are DeepSeek's own tokens)
"""Scripted models with the real chat templates of families whose tool calls trexo parses
itself (`trexo.engine.tool_parsers`): each greedily answers a plain chat, writes a call in its
family's own format when tools are offered (or the user asks about the weather, for DeepSeek,
whose template renders no tools), and answers once the result is back.

Built like `trexo.engine.scripted_model`'s model (a one-layer llama whose greedy next token is
a lookup), with the template's text from `tests/data/chat_templates` and the family's markers
as added tokens. The scripted end of sequence stays the demo tokenizer's `<|im_end|>`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

from trexo.engine.demo_model import DEMO_VOCAB_SIZE, IM_END, DemoModelSpec
from trexo.engine.scripted_model import (
    SCRIPTED_TOOL_ARGUMENTS,
    SCRIPTED_TOOL_NAME,
    Script,
    build_scripted_model,
)

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
ARGUMENTS: Final = json.dumps(SCRIPTED_TOOL_ARGUMENTS)
PLAIN: Final = ("I have", " no tools", " for that.")
RESULT: Final = ("It is", " sunny in Paris.")
PLAIN_ANSWER: Final = "".join(PLAIN)
RESULT_ANSWER: Final = "".join(RESULT)
TOOLS_SCORE, RESULT_SCORE = 20.0, 40.0
"""Attention logits of the markers: a tool result outranks a tools list."""


def template(name: str) -> str:
    return (TEMPLATES / name).read_text()


def chain(*pieces: str) -> dict[str, str]:
    """Each piece's successor; the last one's is `<|im_end|>`."""
    return dict(zip(pieces, (*pieces[1:], IM_END), strict=True))


def script(
    name: str,
    chat_template: str,
    cue: str,
    bigrams: dict[str, str],
    markers: dict[str, tuple[str, float]],
    end_tokens: tuple[str, ...] = (),
) -> Script:
    """A `Script` whose added tokens are every scripted piece, the cue and the markers."""
    pieces = {cue, *markers, *bigrams, *bigrams.values()} - {IM_END}
    return Script(
        name,
        tuple(sorted(pieces)),
        chat_template,
        bigrams,
        {marker: answer for marker, (answer, _) in markers.items()},
        {marker: score for marker, (_, score) in markers.items()},
        cue=cue,
        end_tokens=end_tokens,
    )


def plain_call_result(
    name: str, template_file: str, cue: str, call: tuple[str, ...], tools: str, result: str
) -> Script:
    """The usual script: a plain answer at the `cue`, the `call` once the `tools` marker was
    seen, the result's answer once the `result` marker was."""
    return script(
        name,
        template(template_file),
        cue,
        {cue: PLAIN[0], **chain(*PLAIN), **chain(*call), **chain(*RESULT)},
        {tools: (call[0], TOOLS_SCORE), result: (RESULT[0], RESULT_SCORE)},
    )


# --- Llama 3.2: a bare JSON answer ----------------------------------------------------------

LLAMA_CALL: Final = (f'{{"name": "{SCRIPTED_TOOL_NAME}", ', f'"parameters": {ARGUMENTS}}}')
LLAMA3: Final = plain_call_result(
    "llama3-tools",
    "llama-3.2.jinja",
    "\n\n",  # the generation prompt: <|start_header_id|>assistant<|end_header_id|>\n\n
    LLAMA_CALL,
    "Given the following functions",
    "ipython<|end_header_id|>",  # a tool result's header
)

# --- DeepSeek V3: calls between <｜tool▁calls▁begin｜> and <｜tool▁calls▁end｜> -------------

DEEPSEEK_CALLS_BEGIN: Final = "<｜tool▁calls▁begin｜>"
DEEPSEEK_CALL: Final = (
    DEEPSEEK_CALLS_BEGIN,
    f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{SCRIPTED_TOOL_NAME}\n```json\n",
    ARGUMENTS,
    "\n```<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
)
DEEPSEEK_V3: Final = script(
    "deepseek-v3-tools",
    template("deepseek-v3.jinja"),
    "<｜Assistant｜>",
    {
        "<｜Assistant｜>": PLAIN[0],
        **chain(*PLAIN),
        **chain(*DEEPSEEK_CALL),
        # after a tool result the template ends the prompt here, with no <｜Assistant｜>
        "<｜tool▁outputs▁end｜>": RESULT[0],
        **chain(*RESULT),
    },
    {" weather": (DEEPSEEK_CALL[0], TOOLS_SCORE)},  # its template renders no tools
)

# --- gpt-oss: harmony channels, the call ended by <|call|> ----------------------------------

HARMONY_PLAIN: Final = (
    "<|channel|>analysis<|message|>",
    "The user greets me.",
    "<|end|>",
    "<|start|>assistant<|channel|>final<|message|>",
    "Hello",
    " from gpt-oss.",
)
HARMONY_REASONING: Final = "Need the weather."
HARMONY_CALL: Final = (
    f"<|channel|>analysis<|message|>{HARMONY_REASONING}",
    "<|end|><|start|>assistant<|channel|>commentary to=functions."
    f"{SCRIPTED_TOOL_NAME} <|constrain|>json<|message|>",
    ARGUMENTS,
)
HARMONY_FORCED: Final = (
    " to=functions.",  # the forced call's start, which the prompt ends with
    f"{SCRIPTED_TOOL_NAME}<|channel|>commentary json<|message|>",
    ARGUMENTS,
)
HARMONY_RESULT: Final = ("<|channel|>final<|message|>It is", " sunny in Paris.")
CALL_END: Final = "<|call|>"
GPT_OSS: Final = script(
    "gpt-oss-tools",
    template("gpt-oss.jinja"),
    "<|start|>assistant",
    {
        "<|start|>assistant": HARMONY_PLAIN[0],
        **chain(*HARMONY_PLAIN),
        **chain(*HARMONY_CALL, CALL_END),
        HARMONY_FORCED[0]: HARMONY_FORCED[1],
        HARMONY_FORCED[1]: ARGUMENTS,
        **chain(*HARMONY_RESULT),
    },
    {
        "namespace functions": (HARMONY_CALL[0], TOOLS_SCORE),
        " to=assistant": (HARMONY_RESULT[0], RESULT_SCORE),  # a tool result's header
    },
    end_tokens=(CALL_END,),
)


# --- Command R7B: sections for the plan, the answer and the calls -------------------------

COMMAND_PLAIN: Final = ("<|START_RESPONSE|>", *PLAIN, "<|END_RESPONSE|>")
COMMAND_REASONING: Final = "I will look up the weather."
COMMAND_CALL: Final = (
    "<|START_THINKING|>",
    COMMAND_REASONING,
    "<|END_THINKING|>",
    "<|START_ACTION|>",
    f'[\n    {{"tool_call_id": "0", "tool_name": "{SCRIPTED_TOOL_NAME}", "parameters": ',
    ARGUMENTS,
    "}\n]",
    "<|END_ACTION|>",
)
COMMAND_RESULT: Final = ("<|START_RESPONSE|>It is", " sunny in Paris.", "<|END_RESPONSE|>")
COMMAND_R7B: Final = script(
    "command-r7b-tools",
    template("command-r7b-tool_use.jinja"),
    "<|CHATBOT_TOKEN|>",  # the generation prompt: <|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>
    {
        "<|CHATBOT_TOKEN|>": COMMAND_PLAIN[0],
        **chain(*COMMAND_PLAIN),
        **chain(*COMMAND_CALL),
        **chain(*COMMAND_RESULT),
    },
    {
        "## Available Tools": (COMMAND_CALL[0], TOOLS_SCORE),
        # a tool result's turn (the tools list names <|START_TOOL_RESULT|> alone too)
        "<|SYSTEM_TOKEN|><|START_TOOL_RESULT|>": (COMMAND_RESULT[0], RESULT_SCORE),
    },
)


# --- Command R: `Action:` and a json code block, the turn's end ending it -----------------

COMMAND_R_CALL: Final = (
    "Action:",
    f'\n```json\n[\n    {{\n        "tool_name": "{SCRIPTED_TOOL_NAME}",\n        "parameters": ',
    ARGUMENTS,
    "\n    }\n]```",
)
COMMAND_R: Final = plain_call_result(
    "command-r-tools",
    "command-r-tool_use.jinja",
    "<|CHATBOT_TOKEN|>",
    COMMAND_R_CALL,
    f"def {SCRIPTED_TOOL_NAME}(",  # a tool's definition
    "<results>",
)

# --- Gemma 3: a Python list of calls, the tools shown by trexo ------------------------------

GEMMA_CALL: Final = (f"[{SCRIPTED_TOOL_NAME}(", 'city="Paris")]')
GEMMA_3: Final = plain_call_result(
    "gemma3-tools",
    "gemma-3.jinja",
    "model\n",  # the generation prompt: <start_of_turn>model\n
    GEMMA_CALL,
    "You have access to functions.",
    "```tool_output",
)


# --- Phi-4-mini: tools in the system message's field, calls between <|tool_call|> markers ----

PHI_CALL: Final = (
    "<|tool_call|>",
    f'[{{"name": "{SCRIPTED_TOOL_NAME}", "arguments": ',
    ARGUMENTS,
    "}]",
    "<|/tool_call|>",
)
PHI4_MINI: Final = plain_call_result(
    "phi4-mini-tools",
    "phi-4-mini.jinja",
    "<|assistant|>",
    PHI_CALL,
    "<|tool|>",
    "<|tool_response|>",
)


def build(dest: Path, family: Script) -> Path:
    """`family`'s scripted model, built into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    spec = DemoModelSpec(32, 1, 1, 1, 32, vocab_size=DEMO_VOCAB_SIZE + len(family.added_tokens))
    return build_scripted_model(dest, spec, seed=0, script=family)
