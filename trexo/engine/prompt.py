"""A request's prompt as token ids, and the context a model can hold. Pure, given a tokenizer.

The API node (to admit a request: prompt + `max_tokens` must fit the context) and the runner
(to generate) both call `encode_prompt` with the same tokenizer files, so they count the same.

Tools (OpenAI's function format) go into the chat template, which is how a model learns
what it may call. When a call is forced (`tool_choice` required or a named function), the
generation prompt ends with the tokenizer's tool-call start marker, so the model's first
words are a call (`forced_tool_call`).

User content is tokenized as text: a chat template renders messages to one string, and
tokenizing that string would turn control strings a user typed (`<|im_end|>`,
`<|im_start|>system`) into control tokens, letting them forge turns. So when any content
holds a special token's text, the template is rendered around placeholders and each
message's content is tokenized with special tokens split into ordinary text.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trexo.types.generation import ChatMessage, GenerationRequest, ToolCall, ToolSpec

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
    """`context_length` of the model in `model_dir` (its `config.json`)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return context_length(config) if isinstance(config, dict) else None


def encode_prompt(tokenizer: Any, request: GenerationRequest) -> list[int]:
    """The prompt's token ids: the chat template applied to `messages`, or `prompt`.

    `tokenizer` is mlx-lm's `TokenizerWrapper` (or a Hugging Face tokenizer).
    """
    if request.messages is not None:
        ids = encode_chat(
            tokenizer,
            request.messages,
            template_tools(request),
            continue_final=request.continue_final,
        )
        if forced_tool_call(tokenizer, request):
            ids += _encode(tokenizer, tokenizer.tool_call_start, split_special=False)
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
    tokenizer knows how its model starts one."""
    return (
        request.parses_tool_calls
        and not request.continue_final  # the model is mid-turn: it may call, or go on
        and request.tool_choice.mode in ("required", "function")
        and bool(getattr(tokenizer, "has_tool_calling", False))
    )


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
) -> list[int]:
    """The chat template applied to `messages`; control strings in content stay text.

    `continue_final`: the last (assistant) message is left open for the model to go on,
    as Hugging Face's `continue_final_message` does, instead of a new turn being opened."""
    specials = special_token_texts(tokenizer)
    extra: dict[str, Any] = {"tools": tools} if tools else {}
    if continue_final:
        extra.update(add_generation_prompt=False, continue_final_message=True)
    else:
        extra.update(add_generation_prompt=True)
    if not any(special in m.content for m in messages for special in specials):
        return list(tokenizer.apply_chat_template(_as_dicts(messages), **extra))
    # Placeholders: a random marker nothing else in the rendered text can contain.
    marker = f"trexo{secrets.token_hex(8)}"
    holders = [f"{marker}{i}{marker}" for i in range(len(messages))]
    rendered = tokenizer.apply_chat_template(_as_dicts(messages, holders), tokenize=False, **extra)
    ids: list[int] = []
    rest = rendered
    for holder, message in zip(holders, messages, strict=True):
        before, found, rest = rest.partition(holder)
        if not found:  # the template dropped this message's content: nothing to tokenize
            rest = before
            continue
        ids += _encode(tokenizer, before, split_special=False)
        ids += _encode(tokenizer, message.content, split_special=True)
    ids += _encode(tokenizer, rest, split_special=False)
    return ids


def special_token_texts(tokenizer: Any) -> frozenset[str]:
    """The texts of the tokenizer's special (control) tokens."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's wrapper holds the HF one
    texts = set(hf.all_special_tokens)
    for added in getattr(hf, "added_tokens_decoder", {}).values():
        if getattr(added, "special", False):
            texts.add(added.content)
    return frozenset(t for t in texts if t)


def _as_dicts(
    messages: Sequence[ChatMessage], contents: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    texts = contents if contents is not None else [m.content for m in messages]
    return [_as_dict(m, text) for m, text in zip(messages, texts, strict=True)]


def _as_dict(message: ChatMessage, content: str) -> dict[str, Any]:
    """A message as chat templates read it (Hugging Face's convention, as mlx-lm passes it)."""
    out: dict[str, Any] = {"role": message.role, "content": content}
    if message.tool_calls:
        out["tool_calls"] = [_call_dict(call) for call in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _call_dict(call: ToolCall) -> dict[str, Any]:
    # Templates render arguments with `tojson`: they expect an object, not its JSON text.
    try:
        arguments: Any = json.loads(call.arguments)
    except ValueError:
        arguments = call.arguments
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
