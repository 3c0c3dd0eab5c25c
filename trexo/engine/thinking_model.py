"""The scripted thinking model (size "thinking"): greedy output reasons, then answers.

Tests of thinking output need a model that writes a think block before its answer, as Qwen3
does. It is built like the tool-calling model (`trexo.engine.scripted_model`: a one-layer
llama whose greedy next token is a lookup on the last token), with this script:

- a chat (the generation prompt ends with a newline) is answered with `<think>`,
  `SCRIPTED_REASONING` between newlines, `</think>`, a blank line and `SCRIPTED_ANSWER`,
  then `<|im_end|>`: the output `SCRIPTED_THINKING_OUTPUT`;
- with `enable_thinking` false the template closes an empty think block in the prompt, as
  Qwen3's does (`<think>\\n\\n</think>\\n\\n`), and the model answers at once;
- a prompt that ends with `<think>` (a template that opens the block itself, as
  DeepSeek-R1's does) is continued with the reasoning.

The chat template is Qwen3's, cut down to what the script needs: ChatML, the thinking
switch, and an assistant turn's `reasoning_content` kept in its think block when it comes
after the last user turn (a tool-calling loop), dropped before it. `<think>` and `</think>`
are added (not special) tokens, as in Qwen3's vocabulary, so mlx-lm's `TokenizerWrapper`
finds them (`has_thinking`, `think_start`, `think_end`).
"""

from __future__ import annotations

from typing import Final

from trexo.engine.demo_model import IM_END, THINKING_DEMO_SIZE
from trexo.engine.scripted_model import NEWLINE, Script

THINK_START: Final = "<think>"
THINK_END: Final = "</think>"
BLANK_LINE: Final = "\n\n"
"""Between `</think>` and the answer, as Qwen3 writes it (and its template, thinking off)."""

_REASONING_PIECES: Final = ("\nThe user", " greets me;", " I greet them back.\n")
_ANSWER_PIECES: Final = ("Hello", " from a", " thinking model.")

SCRIPTED_REASONING: Final = "".join(_REASONING_PIECES).strip()
"""The reasoning, as a client gets it (the newlines around it are the template's)."""
SCRIPTED_ANSWER: Final = "".join(_ANSWER_PIECES)
SCRIPTED_THINKING_OUTPUT: Final = (
    THINK_START + "".join(_REASONING_PIECES) + THINK_END + BLANK_LINE + SCRIPTED_ANSWER
)
"""The whole greedy output of a chat with thinking on (before `<|im_end|>`)."""

ADDED_TOKENS: Final = (THINK_START, THINK_END, BLANK_LINE, *_REASONING_PIECES, *_ANSWER_PIECES)

THINKING_CHAT_TEMPLATE: Final = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content and loop.index0 > ns.last_user %}"
    "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- (message.content or '') + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
"""ChatML with Qwen3's thinking switch (`enable_thinking`, on unless false)."""


def _chain(pieces: tuple[str, ...]) -> dict[str, str]:
    """Each piece's successor; the last one's is `<|im_end|>`."""
    return dict(zip(pieces, (*pieces[1:], IM_END), strict=True))


THINKING_SCRIPT: Final = Script(
    THINKING_DEMO_SIZE,
    ADDED_TOKENS,
    THINKING_CHAT_TEMPLATE,
    {
        NEWLINE: THINK_START,
        **_chain((THINK_START, *_REASONING_PIECES, THINK_END, BLANK_LINE, *_ANSWER_PIECES)),
    },
)
