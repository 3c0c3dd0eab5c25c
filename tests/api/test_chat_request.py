"""Parsing and validating Chat Completions bodies: what is accepted, and every 400."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trexo.api.chat_request import (
    MAX_STOP_SEQUENCES,
    SUPPORTED_FIELDS,
    ChatRequest,
    new_completion_id,
    parse_chat_request,
)
from trexo.api.errors import ApiError
from trexo.types.generation import (
    MAX_TEMPLATE_KWARGS_CHARS,
    ChatMessage,
    ResponseFormat,
    SamplingParams,
    ToolCall,
    ToolChoice,
)
from trexo.types.ids import RequestId

RID = RequestId("chatcmpl-test")
USER = {"role": "user", "content": "hi"}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [USER], **fields}


def parse(**fields: Any) -> ChatRequest:
    return parse_chat_request(body(**fields), RID)


def refused(raw: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_chat_request(raw, RID)
    assert caught.value.status == 400
    assert caught.value.type == "invalid_request_error"
    return caught.value


def test_minimal_request_takes_the_defaults() -> None:
    chat = parse()
    assert chat.model_id == "m"
    assert chat.request_id == RID
    assert chat.generation.messages == (ChatMessage("user", "hi"),)
    assert chat.generation.prompt is None
    assert chat.generation.params == SamplingParams()
    assert (chat.stream, chat.include_usage) == (False, False)


def test_request_ids_look_like_openais() -> None:
    ids = {new_completion_id() for _ in range(100)}
    assert len(ids) == 100
    for request_id in ids:
        prefix, hex_part = request_id.split("-")
        assert prefix == "chatcmpl"
        int(hex_part, 16)
    assert parse_chat_request(body()).request_id.startswith("chatcmpl-")


def test_every_sampling_field_is_carried() -> None:
    chat = parse(
        max_tokens=12,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        seed=2**64 - 1,
        stop=["\n\n", "END"],
        repetition_penalty=1.1,
        n=1,
        frequency_penalty=0,
        presence_penalty=0.0,
        user="someone",
    )
    assert chat.generation.params == SamplingParams(
        max_tokens=12,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        seed=2**64 - 1,
        repetition_penalty=1.1,
        stop=("\n\n", "END"),
    )


def test_integers_are_numbers_and_a_stop_string_is_one_stop() -> None:
    params = parse(temperature=1, top_p=1, stop="###").generation.params
    assert (params.temperature, params.top_p, params.stop) == (1.0, 1.0, ("###",))
    assert isinstance(params.temperature, float)


def test_max_completion_tokens_is_max_tokens() -> None:
    assert parse(max_completion_tokens=9).generation.params.max_tokens == 9
    assert parse(max_tokens=9, max_completion_tokens=9).generation.params.max_tokens == 9
    assert refused(body(max_tokens=9, max_completion_tokens=8)).param == "max_completion_tokens"


def test_null_means_absent() -> None:
    nulls = dict.fromkeys(SUPPORTED_FIELDS - {"model", "messages"})
    assert parse(**nulls, functions=None, logit_bias=None) == parse()


def test_messages_roles_and_content_parts() -> None:
    chat = parse(
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "system", "content": "sys"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": None, "refusal": None, "annotations": []},
            {"role": "tool", "content": "42", "tool_call_id": "call-1"},
            {"role": "user", "content": "", "name": "bob"},
        ]
    )
    assert chat.generation.messages == (
        ChatMessage("system", "be brief"),  # developer is system to a chat template
        ChatMessage("system", "sys"),
        ChatMessage("user", "ab"),
        ChatMessage("assistant", ""),
        ChatMessage("tool", "42", tool_call_id="call-1"),
        ChatMessage("user", ""),
    )


def test_a_tool_round_trip_is_carried_whole() -> None:
    chat = parse(
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [call("get_weather", '{"c": 1}')]},
            {"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"},
        ],
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Weather now",
                    "parameters": {"type": "object", "properties": {"c": {"type": "integer"}}},
                    "strict": True,
                },
            }
        ],
        tool_choice=named("get_weather"),
        parallel_tool_calls=False,
    )
    generation = chat.generation
    assert generation.messages is not None
    assert generation.messages[1] == ChatMessage(
        "assistant", "", tool_calls=(ToolCall("call_1", "get_weather", '{"c": 1}'),)
    )
    assert generation.messages[2] == ChatMessage(
        "tool", "sunny", tool_call_id="call_1", name="get_weather"
    )
    (spec,) = generation.tools
    assert (spec.name, spec.description) == ("get_weather", "Weather now")
    assert json.loads(spec.parameters)["properties"] == {"c": {"type": "integer"}}
    assert generation.tool_choice == ToolChoice("function", "get_weather")
    assert generation.parallel_tool_calls is False
    assert generation.parses_tool_calls


def test_logprobs_and_response_formats() -> None:
    assert parse().generation.logprobs is None
    assert parse(logprobs=True).generation.logprobs == 0
    assert parse(logprobs=True, top_logprobs=5).generation.logprobs == 5
    assert parse(response_format={"type": "json_object"}).generation.response_format == (
        ResponseFormat("json_object")
    )
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    fmt = parse(
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    ).generation.response_format
    assert fmt is not None and fmt.kind == "json_schema"
    assert fmt.schema is not None and json.loads(fmt.schema) == schema


def test_stream_options() -> None:
    assert parse(stream=True).include_usage is False
    chat = parse(stream=True, stream_options={"include_usage": True})
    assert (chat.stream, chat.include_usage) == (True, True)
    assert parse(stream=True, stream_options={"include_usage": None}).include_usage is False
    assert refused(body(stream_options={"include_usage": True})).param == "stream_options"
    assert refused(body(stream=True, stream_options={"x": 1})).code == "unknown_parameter"
    error = refused(body(stream=True, stream_options={"include_usage": "yes"}))
    assert error.param == "stream_options.include_usage"


def tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"model": None}, "model", "missing_required_parameter"),
        ({"model": ""}, "model", "invalid_value"),
        ({"model": 3}, "model", "invalid_type"),
        ({"messages": None}, "messages", "missing_required_parameter"),
        ({"messages": []}, "messages", "empty_array"),
        ({"messages": {"role": "user"}}, "messages", "invalid_type"),
        ({"messages": ["hi"]}, "messages[0]", "invalid_type"),
        ({"messages": [{"content": "x"}]}, "messages[0].role", "missing_required_parameter"),
        ({"messages": [{"role": 1, "content": "x"}]}, "messages[0].role", "invalid_type"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role", "invalid_value"),
        ({"messages": [{"role": "user"}]}, "messages[0].content", "missing_required_parameter"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0].type",
            "unsupported_value",
        ),
        (
            {"messages": [{"role": "user", "content": [{"text": "x"}]}]},
            "messages[0].content[0].type",
            "missing_required_parameter",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
            "messages[0].content[0].text",
            "invalid_type",
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"id": "c"}]}]},
            "messages[0].tool_calls[0].type",
            "missing_required_parameter",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
            "messages[0].tool_calls",
            "invalid_value",
        ),
        (
            {"messages": [{"role": "tool", "content": "x"}]},
            "messages[0].tool_call_id",
            "missing_required_parameter",
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": [call("f", "{not json")]}]},
            "messages[0].tool_calls[0].function.arguments",
            "invalid_value",
        ),
        ({"max_tokens": 0}, "max_tokens", "invalid_value"),
        ({"max_tokens": -5}, "max_tokens", "invalid_value"),
        ({"max_tokens": "5"}, "max_tokens", "invalid_type"),
        ({"max_tokens": 5.0}, "max_tokens", "invalid_type"),
        ({"max_tokens": True}, "max_tokens", "invalid_type"),
        ({"max_completion_tokens": 0}, "max_completion_tokens", "invalid_value"),
        ({"temperature": -0.1}, "temperature", "invalid_value"),
        ({"temperature": 2.01}, "temperature", "invalid_value"),
        ({"temperature": "0.5"}, "temperature", "invalid_type"),
        ({"temperature": False}, "temperature", "invalid_type"),
        ({"temperature": float("inf")}, "temperature", "invalid_value"),
        ({"top_p": 1.5}, "top_p", "invalid_value"),
        ({"top_k": -1}, "top_k", "invalid_value"),
        ({"top_k": 1.5}, "top_k", "invalid_type"),
        ({"min_p": 2}, "min_p", "invalid_value"),
        ({"seed": -1}, "seed", "invalid_value"),
        ({"seed": 2**64}, "seed", "invalid_value"),
        ({"seed": "1"}, "seed", "invalid_type"),
        ({"repetition_penalty": 0}, "repetition_penalty", "invalid_value"),
        ({"stop": 3}, "stop", "invalid_type"),
        ({"stop": ""}, "stop", "invalid_value"),
        ({"stop": ["a", 1]}, "stop[1]", "invalid_type"),
        ({"stop": ["a", ""]}, "stop[1]", "invalid_value"),
        ({"stop": ["a"] * (MAX_STOP_SEQUENCES + 1)}, "stop", "invalid_value"),
        ({"stream": 1}, "stream", "invalid_type"),
        ({"stream": True, "stream_options": []}, "stream_options", "invalid_type"),
        ({"n": 2}, "n", "unsupported_value"),
        ({"n": 0}, "n", "invalid_value"),
        ({"n": "1"}, "n", "invalid_type"),
        ({"frequency_penalty": 0.5}, "frequency_penalty", "unsupported_parameter"),
        ({"presence_penalty": -1}, "presence_penalty", "unsupported_parameter"),
        ({"presence_penalty": 3}, "presence_penalty", "invalid_value"),
        ({"user": 7}, "user", "invalid_type"),
        ({"tools": [{"type": "function"}]}, "tools[0].function", "missing_required_parameter"),
        ({"tools": {"type": "function"}}, "tools", "invalid_type"),
        ({"tools": [tool("a b")]}, "tools[0].function.name", "invalid_value"),
        ({"tools": [tool("f"), tool("f")]}, "tools", "invalid_value"),
        ({"tools": [{**tool("f"), "extra": 1}]}, "tools[0].extra", "unknown_parameter"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "tools[0].function.parameters",
            "invalid_type",
        ),
        ({"tool_choice": "auto"}, "tool_choice", "invalid_value"),
        ({"tools": [tool("f")], "tool_choice": "maybe"}, "tool_choice", "invalid_value"),
        ({"tools": [tool("f")], "tool_choice": named("g")}, "tool_choice", "invalid_value"),
        ({"tools": [tool("f")], "parallel_tool_calls": 1}, "parallel_tool_calls", "invalid_type"),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "invalid_value"),
        ({"response_format": "json"}, "response_format", "invalid_type"),
        (
            {"response_format": {"type": "json_schema"}},
            "response_format.json_schema",
            "missing_required_parameter",
        ),
        ({"logprobs": 1}, "logprobs", "invalid_type"),
        ({"top_logprobs": 3}, "top_logprobs", "invalid_value"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "invalid_value"),
        ({"logit_bias": {"1": 5}}, "logit_bias", "unsupported_parameter"),
        ({"functions": [{"name": "f"}]}, "functions", "unsupported_parameter"),
        ({"prompt": "x"}, "prompt", "unknown_parameter"),
        ({"temprature": 0.5}, "temprature", "unknown_parameter"),
    ],
)
def test_refused(fields: dict[str, Any], param: str, code: str) -> None:
    error = refused(body(**fields))
    assert (error.param, error.code) == (param, code)
    assert param.split(".")[0].split("[")[0] in error.message


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": []},
        {"tool_choice": "none"},
        {"tools": [], "tool_choice": "none"},
        {"logprobs": False},
        {"response_format": {"type": "text"}},
        {"frequency_penalty": 0},
        {"modalities": ["text"]},
        {"parallel_tool_calls": True},
        {"store": False},
    ],
)
def test_fields_that_ask_for_nothing_are_accepted(fields: dict[str, Any]) -> None:
    assert parse(**fields) == parse()


@pytest.mark.parametrize("raw", [None, [], "x", 3, [body()]])
def test_body_must_be_an_object(raw: Any) -> None:
    assert refused(raw).code == "invalid_type"


def test_messages_in_errors_are_openais_wording() -> None:
    assert refused(body(messages=None)).message == "Missing required parameter: 'messages'."
    assert refused(body(temperature="hot")).message == (
        "Invalid type for 'temperature': expected a number, but got a string instead."
    )
    assert refused(body(foo=1)).message == "Unrecognized request argument supplied: foo"


# --- properties ------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)
field_names = st.sampled_from(sorted(SUPPORTED_FIELDS | {"tools", "logprobs", "zzz"}))


@given(st.dictionaries(field_names, json_values, max_size=6) | json_values)
def test_any_json_is_parsed_or_refused_with_a_400(raw: Any) -> None:
    error: ApiError | None = None
    try:
        parse_chat_request(raw)
    except ApiError as exc:
        error = exc
    if error is not None:
        assert error.status == 400
        json.dumps(error.body())  # the body is valid JSON


@given(
    max_tokens=st.integers(1, 10**6),
    temperature=st.floats(0, 2),
    top_p=st.floats(0, 1),
    top_k=st.integers(0, 1000),
    seed=st.integers(0, 2**64 - 1),
    stop=st.lists(st.text(min_size=1, max_size=8), max_size=MAX_STOP_SEQUENCES),
    stream=st.booleans(),
    texts=st.lists(st.text(max_size=10), min_size=1, max_size=4),
)
def test_valid_values_arrive_unchanged(
    max_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    seed: int,
    stop: list[str],
    stream: bool,
    texts: list[str],
) -> None:
    messages = [{"role": "user", "content": text} for text in texts]
    fields = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p}
    chat = parse_chat_request(
        json.loads(
            json.dumps(
                body(messages=messages, top_k=top_k, seed=seed, stop=stop, stream=stream, **fields)
            )
        )
    )
    params = chat.generation.params
    assert (params.max_tokens, params.temperature, params.top_p) == tuple(fields.values())
    assert (params.top_k, params.seed, params.stop) == (top_k, seed, tuple(stop))
    assert chat.stream is stream
    assert [m.content for m in chat.generation.messages or ()] == texts


wrong_types: dict[str, Any] = {
    "model": 1,
    "messages": "x",
    "max_tokens": "1",
    "max_completion_tokens": 1.5,
    "temperature": "1",
    "top_p": [],
    "top_k": 0.5,
    "min_p": {},
    "seed": True,
    "stop": 1,
    "stream": "true",
    "stream_options": 1,
    "repetition_penalty": "1",
    "n": "1",
    "frequency_penalty": "0",
    "presence_penalty": [],
    "user": 1,
    "tools": {},
    "tool_choice": 1,
    "parallel_tool_calls": "yes",
    "logprobs": 1,
    "top_logprobs": "1",
    "response_format": "json",
    "reasoning_effort": 1,
    "enable_thinking": "yes",
    "chat_template_kwargs": [],
}


@given(st.sampled_from(sorted(wrong_types)))
def test_a_wrong_type_names_its_field(name: str) -> None:
    extra = {"stream": True} if name == "stream_options" else {}
    error = refused(body(**{**extra, name: wrong_types[name]}))
    assert error.param == name
    assert error.code == "invalid_type"


def test_every_supported_field_has_a_wrong_type_case() -> None:
    assert set(wrong_types) == SUPPORTED_FIELDS


def switches(**fields: Any) -> Any:
    kwargs = parse(**fields).generation.template_kwargs
    return None if kwargs is None else json.loads(kwargs)


def test_thinking_switches_become_template_variables() -> None:
    assert switches() is None
    assert switches(enable_thinking=False) == {"enable_thinking": False}
    assert switches(reasoning_effort="high") == {"reasoning_effort": "high"}
    assert switches(reasoning_effort="none") == {"enable_thinking": False}
    custom = {"enable_thinking": True, "style": {"terse": [1, "a"]}}
    assert switches(chat_template_kwargs=custom) == custom
    # The client's own variables are the most specific: they win.
    both = switches(enable_thinking=False, chat_template_kwargs={"enable_thinking": True})
    assert both == {"enable_thinking": True}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"chat_template_kwargs": {"chat_template": "{{ 1 }}"}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"tokenize": False}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"eos_token": "x"}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"not a name": 1}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"reasoning_effort": 3}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"x": "a" * MAX_TEMPLATE_KWARGS_CHARS}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"x": "\ud800"}}, "chat_template_kwargs"),
    ],
)
def test_template_variables_are_bounded(fields: dict[str, Any], param: str) -> None:
    error = refused(body(**fields))
    assert (error.param, error.code) == (param, "invalid_value")


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_a_replayed_turns_reasoning_reaches_the_template(field: str) -> None:
    turn = {"role": "assistant", "content": "Hi.", field: "Greet back."}
    messages = parse(messages=[USER, turn, USER]).generation.messages or ()
    assert messages[1] == ChatMessage("assistant", "Hi.", reasoning="Greet back.")
    other_shape = {"role": "assistant", "content": "Hi.", "reasoning": {"summary": []}}
    messages = parse(messages=[USER, other_shape]).generation.messages or ()
    assert messages[1].reasoning == ""
