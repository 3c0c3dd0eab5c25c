"""A request's prompt as token ids, and the context a model can hold. Pure, given a tokenizer.

The API node (to admit a request: prompt + `max_tokens` must fit the context) and the runner
(to generate) both call `encode_prompt` with the same tokenizer files, so they count the same.

Tools (OpenAI's function format) go into the chat template, which is how a model learns
what it may call. When a call is forced (`tool_choice` required or a named function), the
generation prompt ends with the tokenizer's tool-call start marker, so the model's first
words are a call (`forced_tool_call`).

What a client sends is tokenized as text: a chat template renders messages and tools to one
string, and tokenizing that string would turn control strings a client typed (`<|im_end|>`,
`<|im_start|>system`) into control tokens, letting them forge turns. So when any string the
template is given (message content, names, tool and parameter descriptions, a replayed
call's arguments) holds a special token's text, each such text is replaced by a placeholder
before rendering, and tokenized as ordinary text where its placeholder came out.

A request's template variables (`enable_thinking`, `reasoning_effort`, a client's
`chat_template_kwargs`) are passed to the template as they are to mlx-lm's server, through
the same placeholders; names the renderer itself takes (`chat_template`, `tokenize`, ...)
are refused (`trexo.types.generation.template_kwargs_problem`). An assistant turn's replayed
reasoning is its message's `reasoning_content`, the name Qwen3's and DeepSeek's templates
read (templates that drop past reasoning ignore it).

The chat template is code from the model's files: whatever it raises on a request's messages
(stock templates raise on a system turn or on the order of roles) is that request's
`PromptError`, and it renders within a time budget (`trexo.engine.template_budget`).
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2

from trexo import safe_json
from trexo.config import TEMPLATE_RENDER_TIMEOUT_S
from trexo.engine.template_budget import TEMPLATE_CODE, TemplateTimeout, template_budget
from trexo.engine.tool_parsers import ToolFormat, tool_family
from trexo.json_file import BadJsonFile, read_json_object
from trexo.types.generation import (
    MAX_TEMPLATE_KWARGS_CHARS,
    ChatMessage,
    GenerationRequest,
    ToolCall,
    ToolSpec,
    template_kwargs_problem,
)


class PromptError(ValueError):
    """The request's messages cannot be made into a prompt: the chat template refused them."""


CONTEXT_LENGTH_KEYS = (
    "max_position_embeddings",
    "max_seq_len",
    "max_sequence_length",
    "seq_length",
    "n_positions",
    "n_ctx",
)
"""Where Hugging Face configs of the model families mlx-lm runs state their context length."""


def context_length(config: Mapping[str, Any]) -> int | None:
    """The longest sequence (prompt + output) the model was built for, if its config says."""
    for source in (config, config.get("text_config") or {}):
        for key in CONTEXT_LENGTH_KEYS:
            value = source.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def read_context_length(model_dir: Path) -> int | None:
    """`context_length` of the model in `model_dir` (its `config.json`); None if it states
    none, or is no JSON object (a hub's file: read bounded, by the hardened decoder)."""
    try:
        config = read_json_object(Path(model_dir) / "config.json")
    except BadJsonFile:
        return None
    return context_length(config)


def encode_prompt(
    tokenizer: Any, request: GenerationRequest, *, render_timeout: float = TEMPLATE_RENDER_TIMEOUT_S
) -> list[int]:
    """The prompt's token ids: the chat template applied to `messages`, or `prompt`.

    `tokenizer` is mlx-lm's `TokenizerWrapper` (or a Hugging Face tokenizer). `PromptError`
    if the chat template raises on these messages or runs longer than `render_timeout`.
    """
    if request.messages is not None:
        ids = encode_chat(
            tokenizer,
            request.messages,
            template_tools(request),
            continue_final=request.continue_final,
            template_kwargs=template_kwargs(request),
            render_timeout=render_timeout,
        )
        if forced_tool_call(tokenizer, request):
            tool_format = ToolFormat.of(tokenizer)
            assert tool_format is not None
            ids += _encode(tokenizer, tool_format.start, split_special=False)
        return ids
    assert request.prompt is not None
    # As mlx-lm does for text prompts: add BOS unless the prompt already starts with it.
    bos = tokenizer.bos_token
    add_special = bos is None or not request.prompt.startswith(bos)
    return list(tokenizer.encode(request.prompt, add_special_tokens=add_special))


def template_tools(request: GenerationRequest) -> list[dict[str, Any]] | None:
    """The tools to show the model, in the chat templates' (OpenAI's) format: none when it
    must not call any, only the named one when that one must be called."""
    choice = request.tool_choice
    if not request.parses_tool_calls:
        return None
    tools = request.tools
    if choice.mode == "function":
        tools = tuple(tool for tool in tools if tool.name == choice.function)
    return [tool_dict(tool) for tool in tools]


def forced_tool_call(tokenizer: Any, request: GenerationRequest) -> bool:
    """Whether the prompt ends inside a tool call: the request demands a call and the
    model's tool format (`trexo.engine.tool_parsers.ToolFormat`) can start one."""
    if not (
        request.parses_tool_calls
        and not request.continue_final  # the model is mid-turn: it may call, or go on
        and request.tool_choice.mode in ("required", "function")
    ):
        return False
    tool_format = ToolFormat.of(tokenizer)
    return tool_format is not None and tool_format.forcible


def template_kwargs(request: GenerationRequest) -> dict[str, Any]:
    """The request's chat template variables; `PromptError` if they are not an object of
    variables a template may be given (a peer's request is checked here, not at an API)."""
    text = request.template_kwargs
    if text is None:
        return {}
    if len(text) > MAX_TEMPLATE_KWARGS_CHARS:
        raise PromptError(f"template variables over {MAX_TEMPLATE_KWARGS_CHARS} characters")
    try:
        kwargs = safe_json.loads(text)
    except safe_json.InvalidJson as exc:
        raise PromptError(f"template variables: {exc}") from None
    if not isinstance(kwargs, dict):
        raise PromptError("template variables must be a JSON object")
    if problem := template_kwargs_problem(kwargs):
        raise PromptError(f"template variables: {problem}")
    return kwargs


def tool_dict(tool: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "parameters": json.loads(tool.parameters)}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def encode_chat(
    tokenizer: Any,
    messages: Sequence[ChatMessage],
    tools: list[dict[str, Any]] | None = None,
    *,
    continue_final: bool = False,
    template_kwargs: Mapping[str, Any] | None = None,
    render_timeout: float = TEMPLATE_RENDER_TIMEOUT_S,
) -> list[int]:
    """The chat template applied to `messages`; control strings a client sent stay text.

    `continue_final`: the last (assistant) message is left open for the model to go on,
    as Hugging Face's `continue_final_message` does, instead of a new turn being opened.
    `template_kwargs`: more variables for the template (checked by `template_kwargs`)."""
    holders = _Placeholders(special_token_texts(tokenizer))
    extra: dict[str, Any] = holders.hide(template_kwargs) if template_kwargs else {}
    if continue_final:
        extra.update(add_generation_prompt=False, continue_final_message=True)
    else:
        extra.update(add_generation_prompt=True)
    family = tool_family(tokenizer)
    plain = _as_dicts(messages, bool(getattr(family, "replayed_arguments_as_text", False)))
    in_messages = getattr(family, "template_messages", None)
    if in_messages is not None:  # a template that renders no tools, calls or results
        plain, tools = in_messages(plain, tools), None
    chat = holders.hide(plain)
    shown_tools = holders.hide(tools) if tools else None
    if shown_tools:
        extra["tools"] = shown_tools
    if not holders.used:
        return list(_render(tokenizer, chat, render_timeout, **extra))
    rendered: str = _render(tokenizer, chat, render_timeout, tokenize=False, **extra)
    ids: list[int] = []
    for k, piece in enumerate(holders.split(rendered)):
        # Even pieces are the template's text; odd ones a client's control string, as text.
        ids += _encode(tokenizer, piece, split_special=k % 2 == 1)
    return ids


def _render(tokenizer: Any, chat: list[dict[str, Any]], timeout: float, **options: Any) -> Any:
    """`apply_chat_template` within `timeout`; whatever the template raises, a `PromptError`."""
    try:
        with template_budget(timeout):
            return tokenizer.apply_chat_template(chat, **options)
    except Exception as exc:
        if not _from_template(exc):
            raise  # e.g. the model has no chat template: not about this request
        # The template is code: what it raises is about these messages, never a reason to
        # fail anything but this request.
        raise PromptError(f"the model's chat template cannot render this request: {exc}") from exc


def _from_template(exc: Exception) -> bool:
    """Whether the template raised `exc`: Jinja's errors (`raise_exception`, the sandbox),
    its time budget, or anything raised while a template's code ran."""
    if isinstance(exc, jinja2.TemplateError | TemplateTimeout):
        return True
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == TEMPLATE_CODE:
            return True
        tb = tb.tb_next
    return False


class _Placeholders:
    """Stands in for control strings inside the strings a chat template is given.

    A placeholder is a random marker around the control string's number: letters and digits
    only, so it comes out of any escaping a template applies (`tojson`) unchanged."""

    def __init__(self, specials: frozenset[str]) -> None:
        self._texts = sorted(specials, key=len, reverse=True)  # the longest match first
        self._find = re.compile("|".join(map(re.escape, self._texts))) if self._texts else None
        self._marker = f"trexo{secrets.token_hex(8)}"
        self._split = re.compile(f"{self._marker}(\\d+){self._marker}")
        self.used = False

    def hide(self, value: Any) -> Any:
        """`value` (JSON-like: dicts, lists, strings) with control strings replaced."""
        if isinstance(value, str):
            return self._hide_text(value)
        if isinstance(value, Mapping):
            return {self.hide(key): self.hide(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self.hide(item) for item in value]
        return value

    def _hide_text(self, text: str) -> str:
        if self._find is None or self._find.search(text) is None:
            return text
        self.used = True
        return self._find.sub(self._holder, text)

    def _holder(self, match: re.Match[str]) -> str:
        return f"{self._marker}{self._texts.index(match.group())}{self._marker}"

    def split(self, rendered: str) -> list[str]:
        """`rendered` cut at placeholders: text, control string, text, ... (the original
        control strings at odd positions)."""
        pieces = self._split.split(rendered)
        return [self._texts[int(p)] if k % 2 else p for k, p in enumerate(pieces)]


def special_token_texts(tokenizer: Any) -> frozenset[str]:
    """The texts of the tokenizer's special (control) tokens."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's wrapper holds the HF one
    texts = set(hf.all_special_tokens)
    for added in getattr(hf, "added_tokens_decoder", {}).values():
        if getattr(added, "special", False):
            texts.add(added.content)
    return frozenset(t for t in texts if t)


def _as_dicts(messages: Sequence[ChatMessage], arguments_as_text: bool) -> list[dict[str, Any]]:
    return [_as_dict(m, arguments_as_text) for m in messages]


def _as_dict(message: ChatMessage, arguments_as_text: bool = False) -> dict[str, Any]:
    """A message as chat templates read it (Hugging Face's convention, as mlx-lm passes it)."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [_call_dict(call, arguments_as_text) for call in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    if message.reasoning:
        out["reasoning_content"] = message.reasoning
    return out


def _call_dict(call: ToolCall, arguments_as_text: bool) -> dict[str, Any]:
    # Most templates render arguments with `tojson`: they expect an object, not its JSON
    # text; a few concatenate them to a string (`arguments_as_text`: DeepSeek's).
    arguments: Any = call.arguments
    if not arguments_as_text:
        with contextlib.suppress(ValueError):
            arguments = json.loads(call.arguments)
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


def _encode(tokenizer: Any, text: str, *, split_special: bool) -> list[int]:
    if not text:
        return []
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    return list(hf.encode(text, add_special_tokens=False, split_special_tokens=split_special))
