"""Parsing and validating Responses bodies: what is accepted, how input items become chat
turns, and every 400."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trexo.api.errors import ApiError
from trexo.api.responses_request import (
    SUPPORTED_FIELDS,
    ResponsesRequest,
    new_response_id,
    not_stored,
    parse_responses_request,
)
from trexo.types.generation import (
    ChatMessage,
    ResponseFormat,
    SamplingParams,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from trexo.types.ids import RequestId

RID = RequestId("resp_test")
WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": WEATHER_PARAMETERS,
    "strict": False,
}
CALL = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_1",
    "name": "get_weather",
    "arguments": '{"city": "Paris"}',
    "status": "completed",
}
CALL_OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": "hi", **fields}


def parse(**fields: Any) -> ResponsesRequest:
    return parse_responses_request(body(**fields), RID)


def refused(raw: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_responses_request(raw, RID)
    assert caught.value.status == 400
    assert caught.value.type == "invalid_request_error"
    return caught.value


def test_minimal_request_takes_the_defaults() -> None:
    parsed = parse()
    assert parsed.model_id == "m"
    assert parsed.response_id == RID
    assert parsed.generation.messages == (ChatMessage("user", "hi"),)
    assert parsed.generation.params == SamplingParams()
    assert parsed.generation.tools == ()
    assert parsed.generation.response_format is None
    assert (parsed.stream, parsed.requested_max_tokens) == (False, None)
    assert parsed.echo["tool_choice"] == "auto"
    assert parsed.echo["tools"] == []
    assert parsed.echo["text"] == {"format": {"type": "text"}}
    assert parsed.echo["temperature"] == 0.0  # trexo's greedy default, as it samples
    assert parsed.echo["store"] is False  # nothing is kept, whatever was asked


def test_response_ids_look_like_openais() -> None:
    ids = {new_response_id() for _ in range(100)}
    assert len(ids) == 100
    for response_id in ids:
        assert response_id.startswith("resp_")
        int(response_id.removeprefix("resp_"), 16)
    assert parse_responses_request(body()).response_id.startswith("resp_")


def test_sampling_fields_are_carried_and_echoed() -> None:
    parsed = parse(max_output_tokens=12, temperature=0.7, top_p=0.9, stream=True)
    assert parsed.generation.params == SamplingParams(max_tokens=12, temperature=0.7, top_p=0.9)
    assert parsed.requested_max_tokens == 12
    assert parsed.stream
    assert (parsed.echo["max_output_tokens"], parsed.echo["temperature"]) == (12, 0.7)
    assert parsed.echo["top_p"] == 0.9


def test_instructions_become_the_first_system_message() -> None:
    parsed = parse(
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Use French."},
            {"role": "user", "content": "hi"},
        ],
    )
    assert parsed.generation.messages == (
        ChatMessage("system", "Be brief."),
        ChatMessage("system", "Use French."),
        ChatMessage("user", "hi"),
    )
    assert parsed.echo["instructions"] == "Be brief."


def test_message_content_parts_are_joined() -> None:
    parsed = parse(
        input=[
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "one "},
                    {"type": "input_text", "text": "two"},
                ],
            },
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "three", "annotations": []}],
            },
        ]
    )
    assert parsed.generation.messages == (
        ChatMessage("user", "one two"),
        ChatMessage("assistant", "three"),
    )


def test_a_tool_round_trip_becomes_chat_turns() -> None:
    parsed = parse(
        input=[{"role": "user", "content": "weather?"}, CALL, CALL_OUTPUT], tools=[WEATHER]
    )
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    assert parsed.generation.messages == (
        ChatMessage("user", "weather?"),
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", "sunny", tool_call_id="call_1", name="get_weather"),
    )


def test_calls_after_the_assistants_text_join_its_turn() -> None:
    second = {**CALL, "call_id": "call_2", "arguments": '{"city": "Rome"}'}
    parsed = parse(
        input=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "Let me look."},
            CALL,
            second,
            CALL_OUTPUT,
            {
                "type": "function_call_output",
                "call_id": "call_2",
                "output": [{"type": "input_text", "text": "rain"}],
            },
        ]
    )
    messages = parsed.generation.messages
    assert messages is not None
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool"]
    assert messages[1].content == "Let me look."
    assert [c.id for c in messages[1].tool_calls] == ["call_1", "call_2"]
    assert (messages[3].content, messages[3].tool_call_id) == ("rain", "call_2")


def test_function_tools_are_parsed_and_echoed() -> None:
    parsed = parse(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    assert parsed.generation.tools == (
        ToolSpec("get_weather", "The weather in a city", json.dumps(WEATHER_PARAMETERS)),
    )
    assert parsed.generation.tool_choice == ToolChoice("required")
    assert parsed.generation.parallel_tool_calls is False
    assert parsed.echo["tools"] == [WEATHER]
    assert parsed.echo["tool_choice"] == "required"
    assert parsed.echo["parallel_tool_calls"] is False


def test_a_named_function_choice() -> None:
    choice = {"type": "function", "name": "get_weather"}
    parsed = parse(tools=[WEATHER], tool_choice=choice)
    assert parsed.generation.tool_choice == ToolChoice("function", "get_weather")
    assert parsed.echo["tool_choice"] == choice


def test_text_formats() -> None:
    assert parse(text={"format": {"type": "text"}}).generation.response_format is None
    json_object = parse(text={"format": {"type": "json_object"}})
    assert json_object.generation.response_format == ResponseFormat("json_object")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    spec = {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}
    parsed = parse(text={"format": spec})
    assert parsed.generation.response_format == ResponseFormat("json_schema", json.dumps(schema))
    assert parsed.echo["text"] == {"format": spec}


def test_accepted_fields_that_ask_for_nothing() -> None:
    parsed = parse(
        metadata={"k": "v"},
        user="someone",
        store=True,
        reasoning={"effort": None},
        truncation="disabled",
        include=[],
        background=False,
        previous_response_id=None,
        service_tier="auto",
        stream=True,
        stream_options={"include_obfuscation": False},
    )
    assert parsed.echo["metadata"] == {"k": "v"}
    assert parsed.echo["user"] == "someone"


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"bogus": 1}, "bogus", "unknown_parameter"),
        ({"previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
        ({"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort", "invalid_value"),
        ({"reasoning": {"summary": "long"}}, "reasoning.summary", "invalid_value"),
        ({"reasoning": {"bogus": 1}}, "reasoning.bogus", "unknown_parameter"),
        ({"truncation": "auto"}, "truncation", "unsupported_parameter"),
        ({"truncation": "sometimes"}, "truncation", "invalid_value"),
        ({"background": True}, "background", "unsupported_parameter"),
        ({"include": ["message.output_text.logprobs"]}, "include", "unsupported_parameter"),
        ({"input": []}, "input", "empty_array"),
        ({"input": 3}, "input", "invalid_type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "invalid_value"),
        ({"input": [{"role": "user"}]}, "input[0].content", "missing_required_parameter"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
            "unsupported_value",
        ),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "unsupported_value"),
        ({"input": [{"type": "web_search_call", "id": "x"}]}, "input[0].type", "unsupported_value"),
        (
            {"input": [{"type": "reasoning", "content": [{"type": "x", "text": "t"}]}]},
            "input[0].content[0].type",
            "unsupported_value",
        ),
        ({"input": [{**CALL, "arguments": "[1]"}]}, "input[0].arguments", "invalid_value"),
        ({"input": [{**CALL, "call_id": None}]}, "input[0].call_id", "missing_required_parameter"),
        ({"input": ["x", CALL_OUTPUT]}, "input[0]", "invalid_type"),
        (
            {"input": [{"role": "user", "content": "x"}, CALL_OUTPUT]},
            "input[1].call_id",
            "invalid_value",
        ),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported_value"),
        ({"tools": [{**WEATHER, "name": "a b"}]}, "tools[0].name", "invalid_value"),
        ({"tools": [{**WEATHER, "strict": "yes"}]}, "tools[0].strict", "invalid_type"),
        ({"tools": [WEATHER, WEATHER]}, "tools", "invalid_value"),
        ({"tool_choice": "auto"}, "tool_choice", "invalid_value"),  # no tools
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}},
            "tool_choice",
            "invalid_value",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "file_search"}},
            "tool_choice.type",
            "unsupported_value",
        ),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type", "invalid_value"),
        ({"text": {"verbosity": "low"}}, "text.verbosity", "unsupported_parameter"),
        (
            {"text": {"format": {"type": "json_schema", "schema": {}}}},
            "text.format.name",
            "missing_required_parameter",
        ),
        ({"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
        ({"temperature": 3}, "temperature", "invalid_value"),
        ({"top_p": "high"}, "top_p", "invalid_type"),
        ({"stream_options": {"include_obfuscation": True}}, "stream_options", "invalid_value"),
        ({"metadata": {"k": 1}}, "metadata.k", "invalid_type"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata", "invalid_value"),
        ({"instructions": 5}, "instructions", "invalid_type"),
        ({"model": None}, "model", "missing_required_parameter"),
        ({"input": "\ud800"}, "input", "invalid_value"),
    ],
)
def test_bad_requests_name_their_parameter(fields: dict[str, Any], param: str, code: str) -> None:
    error = refused(body(**fields))
    assert (error.param, error.code) == (param, code)


def test_missing_input_and_non_object_bodies() -> None:
    assert refused({"model": "m"}).param == "input"
    assert refused([]).code == "invalid_type"


def test_stateful_requests_say_trexo_stores_nothing() -> None:
    assert "does not store responses" in refused(body(previous_response_id="resp_1")).message
    error = refused(body(input=[{"type": "item_reference", "id": "msg_1"}]))
    assert "does not store responses" in error.message
    lookup = not_stored("resp_1")
    assert (lookup.status, lookup.code) == (404, "response_not_found")
    assert "resp_1" in lookup.message


def test_every_supported_field_is_accepted() -> None:
    values: dict[str, Any] = {
        "model": "m",
        "input": "hi",
        "instructions": "x",
        "tools": [WEATHER],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "max_output_tokens": 5,
        "temperature": 1,
        "top_p": 1,
        "stream": True,
        "stream_options": {},
        "text": {},
        "metadata": {},
        "user": "u",
        "store": False,
        "reasoning": {},
        "truncation": "disabled",
        "safety_identifier": "s",
        "prompt_cache_key": "k",
    }
    assert set(values) == SUPPORTED_FIELDS
    assert parse_responses_request(values, RID).generation.tools


def test_reasoning_effort_reaches_the_template_and_is_echoed() -> None:
    parsed = parse(reasoning={"effort": "low", "summary": "auto"})
    assert json.loads(parsed.generation.template_kwargs or "") == {"reasoning_effort": "low"}
    assert parsed.echo["reasoning"] == {"effort": "low", "summary": "auto"}
    off = parse(reasoning={"effort": "none"}).generation.template_kwargs
    assert json.loads(off or "") == {"enable_thinking": False}
    assert parse().generation.template_kwargs is None


def test_a_replayed_reasoning_item_is_the_reasoning_of_the_turn_after_it() -> None:
    reasoning = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "Ask the tool."}],
        "status": "completed",
    }
    summarised = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Done."}]}
    answer = {"role": "assistant", "content": "Sunny."}
    user = {"role": "user", "content": "hi"}
    generation = parse(input=[user, reasoning, CALL, CALL_OUTPUT, summarised, answer]).generation
    assert generation.messages == (
        ChatMessage("user", "hi"),
        ChatMessage(
            "assistant",
            "",
            tool_calls=(ToolCall("call_1", "get_weather", CALL["arguments"]),),
            reasoning="Ask the tool.",
        ),
        ChatMessage("tool", "sunny", tool_call_id="call_1", name="get_weather"),
        ChatMessage("assistant", "Sunny.", reasoning="Done."),
    )
