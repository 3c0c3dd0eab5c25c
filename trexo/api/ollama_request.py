"""Parse and validate Ollama API request bodies (`/api/chat`, `/api/generate`, `/api/show`).
Pure: no I/O; problems raise a 400 `ApiError` naming the field.

Choices where Ollama and trexo differ:
- `stream` defaults to true, as in Ollama.
- An absent sampling option takes `SamplingParams`' default (greedy, as every trexo dialect),
  not Ollama's (temperature 0.8, top_k 40, top_p 0.9): the same request means the same thing
  on every endpoint of a node.
- `options` are mapped: temperature, top_p, top_k, min_p, seed (-1: random), stop,
  num_predict (max_tokens; -1 and -2: what fits the context), repeat_penalty
  (repetition_penalty). Options that only tune how Ollama loads or runs a model (num_ctx,
  num_thread, num_gpu, ...) are accepted and ignored: trexo places models itself and uses
  each model's whole context. Options trexo's sampler does not have (mirostat, typical_p,
  tfs_z, presence/frequency penalties, or any other name) are accepted and ignored, as Ollama
  ignores options its engine does not use (clients send their own defaults with every
  request); the view logs their names at debug level.
- `keep_alive` is accepted and ignored: a placed model stays until its instance is deleted.
- Other unknown fields are refused (Ollama ignores them), so a typo is not silently ignored;
  unknown fields inside messages are ignored, so replayed turns pass. An assistant turn's
  `thinking` is replayed to the chat template as its reasoning.
- `think` reaches the chat template (`trexo.api.reasoning_request`): true or false is
  `enable_thinking`, "low", "medium" or "high" (gpt-oss's levels) `reasoning_effort`;
  absent, the template's default, which for thinking models is to think (as Ollama's
  thinking models do by default). A chat's thinking is always returned apart from its
  answer (`message.thinking`, `thinking`), also when `think` is false and the model thinks
  anyway: it is never mixed into the answer. A raw `/api/generate` prompt has no template,
  so its output is the text as generated.
- `images`, `suffix`, `template`, `context` and image-generation fields are refused unless
  they ask for nothing: trexo cannot honour them.
- An empty `messages` (chat) or absent `prompt` (generate) asks Ollama to load the model:
  the request then carries no generation (`OllamaRequest.generation` is None).
- Model names: Ollama's implicit `:latest` tag is dropped when the bare name is the model's
  (`model_name`), so `llama:latest` finds `llama`.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any, Final, Literal

import attrs

from trexo.api.chat_request import MAX_SEED, MAX_TOKENS_LIMIT, parse_logprobs
from trexo.api.errors import ApiError
from trexo.api.reasoning_request import effort, template_kwargs_text, thinking
from trexo.api.tool_request import arguments_text, parse_chat_tools
from trexo.api.validation import (
    invalid_type,
    invalid_value,
    is_int,
    present,
    read_bool,
    read_int,
    read_number,
    read_str,
    require_object,
    required_str,
    unknown,
    valid_text,
)
from trexo.types.generation import (
    ChatMessage,
    GenerationRequest,
    ResponseFormat,
    SamplingParams,
    ToolCall,
)
from trexo.types.ids import RequestId, new_id

Endpoint = Literal["chat", "generate"]

REQUEST_ID_PREFIX = "ollama-"
LATEST_TAG = ":latest"
"""Ollama's default tag: `llama3.2` and `llama3.2:latest` name the same model."""
MESSAGE_ROLES: Final = ("system", "user", "assistant", "tool")
MAX_STOP_SEQUENCES = 16
"""Ollama has no limit; this one only bounds the work of matching stops."""
UNTIL_CONTEXT: Final = (-1, -2)
"""`num_predict` values meaning "no limit" and "fill the context": both are what fits."""
RANDOM_SEED = -1

COMMON_FIELDS: Final = frozenset(
    {"model", "stream", "format", "options", "keep_alive", "think", "logprobs", "top_logprobs"}
)
CHAT_FIELDS: Final = COMMON_FIELDS | {"messages", "tools"}
GENERATE_FIELDS: Final = COMMON_FIELDS | {"prompt", "system", "raw"}
REFUSED_UNLESS_EMPTY: Final[Mapping[str, str]] = {
    # field -> why trexo refuses it when it asks for something
    "suffix": "trexo does not fill in the middle",
    "images": "trexo serves text models only",
    "template": "trexo applies the model's own chat template",
    "context": "it is deprecated; send the conversation to /api/chat instead",
    "width": "trexo does not generate images",
    "height": "trexo does not generate images",
    "steps": "trexo does not generate images",
}
MAPPED_OPTIONS: Final = frozenset(
    {"temperature", "top_p", "top_k", "min_p", "seed", "num_predict", "stop", "repeat_penalty"}
)
IGNORED_OPTIONS: Final = frozenset(
    {
        # how Ollama loads and runs a model: trexo decides these itself
        "numa",
        "num_ctx",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "low_vram",
        "f16_kv",
        "logits_all",
        "vocab_only",
        "use_mmap",
        "use_mlock",
        "embedding_only",
        "num_thread",
        # context shifting (trexo never shifts) and llama.cpp's penalty details
        "num_keep",
        "repeat_last_n",
        "penalize_newline",
    }
)
NEUTRAL_OPTIONS: Final[Mapping[str, float]] = {
    # option -> the value that asks for nothing
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "mirostat": 0.0,
    "typical_p": 1.0,
    "tfs_z": 1.0,
}
FORMAT_JSON = "json"
THINK_LEVELS: Final = ("low", "medium", "high")
"""`think`'s levels (for gpt-oss), besides true and false."""


@attrs.frozen
class OllamaRequest:
    """A validated `/api/chat` or `/api/generate` request."""

    model: str
    """The model as the client named it (echoed in every response line)."""
    request_id: RequestId
    generation: GenerationRequest | None
    """None: a load request (no messages, no prompt), answered at once."""
    stream: bool = True
    requested_max_tokens: int | None = None
    """`num_predict` as the client gave it; None: what fits the context."""
    ignored_options: tuple[str, ...] = ()
    """`options` trexo's sampler does not have (accepted and ignored, as Ollama does)."""


def new_request_id() -> RequestId:
    return RequestId(REQUEST_ID_PREFIX + new_id())


def model_name(name: str, known: Collection[str]) -> str:
    """The model id `name` stands for: itself, or without Ollama's implicit `:latest`."""
    if name not in known and name.endswith(LATEST_TAG):
        bare = name.removesuffix(LATEST_TAG)
        if bare in known:
            return bare
    return name


def parse_chat(body: Any, request_id: RequestId | None = None) -> OllamaRequest:
    """An `/api/chat` body; `request_id` defaults to a fresh `new_request_id()`."""
    fields = _fields(body, CHAT_FIELDS)
    model = _model(fields)
    shared = _shared(fields)
    tools = parse_chat_tools(fields["tools"]) if "tools" in fields else ()
    messages = _parse_messages(fields.get("messages", []))
    request_id = request_id or new_request_id()
    if not messages:
        return OllamaRequest(model, request_id, None, shared.stream)
    generation = GenerationRequest(
        request_id=request_id,
        messages=messages,
        params=shared.params,
        tools=tools,
        logprobs=shared.logprobs,
        response_format=shared.response_format,
        template_kwargs=shared.template_kwargs,
    )
    return shared.request(model, request_id, generation)


def parse_generate(body: Any, request_id: RequestId | None = None) -> OllamaRequest:
    """An `/api/generate` body: a raw prompt (`raw`), or a user turn (and a system turn) the
    model's chat template is applied to, as Ollama applies its template."""
    fields = _fields(body, GENERATE_FIELDS)
    model = _model(fields)
    shared = _shared(fields)
    prompt = _text(fields, "prompt")
    system = _text(fields, "system")
    raw = read_bool(fields, "raw") or False
    if raw and system:
        raise invalid_value("system", "a raw prompt has no template to put a system prompt in")
    request_id = request_id or new_request_id()
    if not prompt:
        return OllamaRequest(model, request_id, None, shared.stream)
    turns = (ChatMessage("system", system),) if system else ()
    generation = GenerationRequest(
        request_id=request_id,
        messages=None if raw else (*turns, ChatMessage("user", prompt)),
        prompt=prompt if raw else None,
        params=shared.params,
        logprobs=shared.logprobs,
        response_format=shared.response_format,
        template_kwargs=None if raw else shared.template_kwargs,
    )
    return shared.request(model, request_id, generation)


def parse_show(body: Any) -> str:
    """The model an `/api/show` body names (`model`, or its older name `name`)."""
    fields = present(require_object(body))
    for name in fields:
        if name not in ("model", "name", "verbose", "system", "template", "options"):
            raise unknown(name)
    read_bool(fields, "verbose")
    key = "model" if "model" in fields or "name" not in fields else "name"
    model = required_str(fields, key)
    if not model:
        raise invalid_value(key, "expected a non-empty string")
    return model


# --- shared fields -----------------------------------------------------------------------------


def _fields(body: Any, allowed: frozenset[str]) -> dict[str, Any]:
    fields = present(require_object(body))
    for name, value in fields.items():
        if name in allowed:
            continue
        if name not in REFUSED_UNLESS_EMPTY:
            raise unknown(name)
        if value not in ("", [], {}):
            raise _refused(name, REFUSED_UNLESS_EMPTY[name])
    return fields


def _model(fields: Mapping[str, Any]) -> str:
    model = required_str(fields, "model")
    if not model:
        raise invalid_value("model", "expected a non-empty string")
    return model


@attrs.frozen
class _Shared:
    """What `/api/chat` and `/api/generate` bodies ask for alike."""

    stream: bool
    params: SamplingParams
    ignored_options: tuple[str, ...]
    requested_max_tokens: int | None
    response_format: ResponseFormat | None
    logprobs: int | None
    template_kwargs: str | None

    def request(
        self, model: str, request_id: RequestId, generation: GenerationRequest
    ) -> OllamaRequest:
        return OllamaRequest(
            model,
            request_id,
            generation,
            self.stream,
            self.requested_max_tokens,
            self.ignored_options,
        )


def _shared(fields: Mapping[str, Any]) -> _Shared:
    stream = read_bool(fields, "stream")
    keep_alive = fields.get("keep_alive")
    if keep_alive is not None and not isinstance(keep_alive, str | int | float):
        raise invalid_type("keep_alive", "a duration (a number or a string)", keep_alive)
    params, requested, ignored = parse_options(fields.get("options"))
    return _Shared(
        stream=True if stream is None else stream,
        params=params,
        ignored_options=ignored,
        requested_max_tokens=requested,
        response_format=parse_format(fields.get("format")),
        logprobs=parse_logprobs(fields),
        template_kwargs=template_kwargs_text(_think(fields.get("think")), "think"),
    )


def _think(think: Any) -> dict[str, Any]:
    """The template switch `think` asks for: on or off, or a level of effort."""
    if think is None or isinstance(think, bool):
        return thinking(think)
    if not isinstance(think, str):
        raise invalid_type("think", "a boolean or a string", think)
    return effort(think, "think", THINK_LEVELS)


def _refused(name: str, why: str) -> ApiError:
    return ApiError(
        400,
        f"Unsupported parameter: '{name}' is not supported by trexo: {why}.",
        param=name,
        code="unsupported_parameter",
    )


def _text(fields: Mapping[str, Any], name: str) -> str:
    return valid_text(read_str(fields, name) or "", name)


def parse_format(raw: Any) -> ResponseFormat | None:
    """`format`: "json" (any JSON object), a JSON schema object, or "" / absent (free text)."""
    if raw is None or raw == "":
        return None
    if raw == FORMAT_JSON:
        return ResponseFormat("json_object")
    if not isinstance(raw, dict):
        raise invalid_value("format", f"expected {FORMAT_JSON!r} or a JSON schema object")
    # Compiled later, bounded, off the event loop (`trexo.api.views.admit_generation`).
    return ResponseFormat("json_schema", json.dumps(raw, ensure_ascii=False))


# --- options ---------------------------------------------------------------------------------


def parse_options(raw: Any) -> tuple[SamplingParams, int | None, tuple[str, ...]]:
    """The sampling parameters `options` ask for, `num_predict` (None: what fits), and the
    options ignored: those trexo's sampler does not have, at a value that asks for something."""
    if raw is None:
        return SamplingParams(), None, ()
    options = present(require_object(raw, "options"))
    unused = sorted(
        name
        for name, value in options.items()
        if name not in MAPPED_OPTIONS
        and name not in IGNORED_OPTIONS
        and not (name in NEUTRAL_OPTIONS and _is_number(value) and value == NEUTRAL_OPTIONS[name])
    )
    # As Ollama does with options its engine does not use, they are accepted and ignored (the
    # view logs them): clients send their own defaults (`typical_p`, ...) with every request.
    # The readers name the field they read: give them the options' full names.
    fields = {f"options.{name}": value for name, value in options.items()}
    defaults = SamplingParams()
    requested = _num_predict(fields)
    temperature = read_number(fields, "options.temperature", low=0.0)
    top_p = read_number(fields, "options.top_p", low=0.0, high=1.0)
    top_k = read_int(fields, "options.top_k", low=0)
    min_p = read_number(fields, "options.min_p", low=0.0, high=1.0)
    params = SamplingParams(
        max_tokens=defaults.max_tokens if requested is None else requested,
        temperature=defaults.temperature if temperature is None else temperature,
        top_p=defaults.top_p if top_p is None else top_p,
        top_k=defaults.top_k if top_k is None else top_k,
        min_p=defaults.min_p if min_p is None else min_p,
        seed=_seed(fields),
        repetition_penalty=read_number(fields, "options.repeat_penalty", low=0.0, low_open=True),
        stop=_stops(fields.get("options.stop")),
    )
    return params, requested, tuple(unused)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _num_predict(fields: Mapping[str, Any]) -> int | None:
    value = fields.get("options.num_predict")
    if value in UNTIL_CONTEXT and is_int(value):
        return None
    if is_int(value) and value < 1:
        raise invalid_value(
            "options.num_predict",
            f"expected -1, -2 or a value >= 1, but got {value} instead",
        )
    return read_int(fields, "options.num_predict", low=1, high=MAX_TOKENS_LIMIT)


def _seed(fields: Mapping[str, Any]) -> int | None:
    if fields.get("options.seed") == RANDOM_SEED and is_int(fields["options.seed"]):
        return None
    return read_int(fields, "options.seed", low=0, high=MAX_SEED)


def _stops(raw: Any) -> tuple[str, ...]:
    where = "options.stop"
    if raw is None:
        return ()
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list):
        raise invalid_type(where, "an array of strings", raw)
    if len(stops) > MAX_STOP_SEQUENCES:
        raise invalid_value(
            where, f"expected at most {MAX_STOP_SEQUENCES} sequences, but got {len(stops)}"
        )
    for i, stop in enumerate(stops):
        if not isinstance(stop, str):
            raise invalid_type(f"{where}[{i}]", "a string", stop)
        if not stop:
            raise invalid_value(f"{where}[{i}]", "a stop sequence must not be empty")
        valid_text(stop, f"{where}[{i}]")
    return tuple(stops)


# --- messages --------------------------------------------------------------------------------


def _parse_messages(raw: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(raw, list):
        raise invalid_type("messages", "an array", raw)
    return tuple(_parse_message(item, f"messages[{i}]", i) for i, item in enumerate(raw))


def _parse_message(raw: Any, where: str, index: int) -> ChatMessage:
    """One message (an assistant's `thinking` replayed); its other fields are ignored, so
    replayed turns pass."""
    message = present(require_object(raw, where))
    role = required_str(message, "role", where=f"{where}.role")
    if role not in MESSAGE_ROLES:
        raise invalid_value(
            f"{where}.role",
            f"expected one of {', '.join(MESSAGE_ROLES)}, but got {role!r} instead",
        )
    if message.get("images"):
        raise _refused(f"{where}.images", REFUSED_UNLESS_EMPTY["images"])
    content = read_str(message, "content", where=f"{where}.content") or ""
    valid_text(content, f"{where}.content")
    calls: tuple[ToolCall, ...] = ()
    if message.get("tool_calls"):
        if role != "assistant":
            raise invalid_value(f"{where}.tool_calls", "only assistant messages make tool calls")
        calls = _parse_tool_calls(message["tool_calls"], f"{where}.tool_calls", index)
    if role == "assistant":
        thought = message.get("thinking")
        reasoning = valid_text(thought, f"{where}.thinking") if isinstance(thought, str) else ""
        return ChatMessage(role, content, tool_calls=calls, reasoning=reasoning)
    if role != "tool":
        return ChatMessage(role, content)
    name = read_str(message, "tool_name", where=f"{where}.tool_name")
    name = name or read_str(message, "name", where=f"{where}.name")
    call_id = read_str(message, "tool_call_id", where=f"{where}.tool_call_id")
    return ChatMessage(role, content, tool_call_id=call_id, name=name)


def _parse_tool_calls(raw: Any, where: str, message_index: int) -> tuple[ToolCall, ...]:
    """An assistant turn's calls, `[{"function": {"name", "arguments": {...}}}]`; a call
    without an `id` (Ollama's older shape) gets one from its place in the conversation, so
    the same conversation renders the same prompt (and hits the same prompt cache)."""
    if not isinstance(raw, list):
        raise invalid_type(where, "an array", raw)
    calls = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        fields = present(require_object(item, at))
        function = present(require_object(fields.get("function"), f"{at}.function"))
        arguments = function.get("arguments", {})
        if isinstance(arguments, dict):
            text = json.dumps(arguments, ensure_ascii=False)
        elif isinstance(arguments, str):  # OpenAI's shape, which some clients send
            text = arguments_text(arguments, f"{at}.function.arguments")
        else:
            raise invalid_type(f"{at}.function.arguments", "an object", arguments)
        call_id = read_str(fields, "id", where=f"{at}.id") or f"call_{message_index}_{i}"
        name = required_str(function, "name", where=f"{at}.function.name")
        calls.append(ToolCall(call_id, name, text))
    return tuple(calls)
