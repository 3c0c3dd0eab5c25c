"""What a generation asks for: chat messages or a prompt, tools, and how to sample.

Every API dialect (OpenAI Chat, Completions and Responses, Anthropic Messages, Ollama)
translates its request into one `GenerationRequest`; this is the whole of what a runner is
told. JSON values a dialect passes through untouched (a tool's parameter schema, a call's
arguments, a response schema) travel as JSON text: hashable, and opaque to the wire.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs

from trexo.types.ids import RequestId

DEFAULT_MAX_TOKENS = 256
MAX_TOP_LOGPROBS = 20
"""OpenAI's limit on `top_logprobs`."""

MAX_TEMPLATE_KWARGS_CHARS = 4096
"""The JSON text of a request's chat template variables: room for many switches (a Qwen3
`enable_thinking`, a gpt-oss `reasoning_effort`), not for a payload the template would
render on every request."""
TEMPLATE_KWARG_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
RESERVED_TEMPLATE_KWARGS: Final = frozenset(
    {
        # what Hugging Face's `apply_chat_template` takes itself: how to render, not a
        # variable (`chat_template` would swap the model's template for the client's)
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        # what transformers gives every template: the special tokens and its helpers
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
        "additional_special_tokens",
        "raise_exception",
        "strftime_now",
    }
)
TYPED_TEMPLATE_KWARGS: Final[Mapping[str, tuple[type, str]]] = {
    "enable_thinking": (bool, "a boolean"),
    "reasoning_effort": (str, "a string"),
}
"""The switches templates read by these names (Qwen3, DeepSeek, gpt-oss), and their types."""

ToolChoiceMode = Literal["auto", "none", "required", "function"]
ResponseFormatKind = Literal["json_object", "json_schema"]


@attrs.frozen
class ToolCall:
    """A function call the model made (or made earlier, replayed in a conversation)."""

    id: str
    name: str
    arguments: str
    """The arguments as JSON text (an object), as OpenAI carries them."""


@attrs.frozen
class ChatMessage:
    """One turn. `role` is system, user, assistant or tool (dialects map theirs onto these)."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    """An assistant turn's calls."""
    tool_call_id: str | None = None
    """A tool turn: the call it answers."""
    name: str | None = None
    """A tool turn: the function that answered (some chat templates render it)."""
    reasoning: str = ""
    """An assistant turn's reasoning (its think block), replayed: templates that keep it
    render it as `reasoning_content`."""


@attrs.frozen
class ToolSpec:
    """A function the model may call."""

    name: str
    description: str | None = None
    parameters: str = '{"type": "object", "properties": {}}'
    """The parameters' JSON Schema, as JSON text."""


@attrs.frozen
class ToolChoice:
    """Whether the model may (`auto`), must not (`none`) or must (`required`) call a tool,
    or must call the one named `function`."""

    mode: ToolChoiceMode = "auto"
    function: str | None = None

    def __attrs_post_init__(self) -> None:
        if (self.mode == "function") != (self.function is not None):
            raise ValueError("a tool choice names a function exactly when its mode is 'function'")


@attrs.frozen
class ResponseFormat:
    """Constrained output: any JSON object, or JSON matching `schema` (JSON text)."""

    kind: ResponseFormatKind
    schema: str | None = None

    def __attrs_post_init__(self) -> None:
        if (self.kind == "json_schema") != (self.schema is not None):
            raise ValueError("a response format has a schema exactly when its kind is json_schema")


@attrs.frozen
class SamplingParams:
    """Sampling knobs, as mlx-lm's `make_sampler` / `make_logits_processors` take them.

    `temperature == 0` is greedy decoding. Zero for `top_p`, `top_k`, `min_p` means "off".
    """

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    top_p: float = 0.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float | None = None
    stop: tuple[str, ...] = ()


@attrs.frozen
class GenerationRequest:
    """One generation. Exactly one of `messages` (chat template applied) or `prompt` is set."""

    request_id: RequestId
    messages: tuple[ChatMessage, ...] | None = None
    prompt: str | None = None
    params: SamplingParams = SamplingParams()
    tools: tuple[ToolSpec, ...] = ()
    """Functions the model may call; calls in its output are parsed (chat requests only)."""
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    """False: at most one call is returned (the first)."""
    logprobs: int | None = None
    """None: no log probabilities; n >= 0: each token's, with its `n` most likely rivals."""
    response_format: ResponseFormat | None = None
    continue_final: bool = False
    """The last message is an assistant turn the model goes on writing (Anthropic's
    "prefill"), not a finished one; the answer is what it adds."""
    template_kwargs: str | None = None
    """Variables for the chat template besides the messages and tools (`enable_thinking`,
    `reasoning_effort`, a client's `chat_template_kwargs`), as the JSON text of an object
    (`template_kwargs_problem` says what one may hold)."""

    def __attrs_post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("a generation request needs exactly one of messages or prompt")
        if self.continue_final and not (self.messages and self.messages[-1].role == "assistant"):
            raise ValueError("only a last assistant message can be continued")
        if self.tools and self.messages is None:
            raise ValueError("tools need a chat (messages), not a raw prompt")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top logprobs must be within 0..{MAX_TOP_LOGPROBS}")

    @property
    def parses_tool_calls(self) -> bool:
        """Whether the model is offered tools, so its calls are parsed out of its text."""
        return bool(self.tools) and self.tool_choice.mode != "none"


def template_kwargs_problem(kwargs: Mapping[str, Any]) -> str | None:
    """What is wrong with `kwargs` as a request's chat template variables, or None.

    Names are identifiers, none of them one `apply_chat_template` or transformers reserves;
    the known switches have their types; the whole is at most `MAX_TEMPLATE_KWARGS_CHARS`
    of JSON text (the caller checks that, having written it)."""
    for name, value in kwargs.items():
        if not isinstance(name, str) or not TEMPLATE_KWARG_NAME.fullmatch(name):
            return f"{name!r} is not a template variable's name (letters, digits, underscores)"
        if name in RESERVED_TEMPLATE_KWARGS:
            return f"{name!r} is not a template variable: the chat template's renderer sets it"
        if name in TYPED_TEMPLATE_KWARGS:
            kind, described = TYPED_TEMPLATE_KWARGS[name]
            if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
                return f"{name!r} must be {described}"
    return None
