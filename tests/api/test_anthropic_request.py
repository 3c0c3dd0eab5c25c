"""Parsing and validating Anthropic Messages bodies: what is accepted, and every 400."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trexo.api.anthropic_request import (
    MAX_STOP_SEQUENCES,
    TOOL_ERROR_PREFIX,
    MessagesRequest,
    new_message_id,
    parse_count_tokens_request,
    parse_messages_request,
)
from trexo.api.errors import ApiError
from trexo.types.generation import (
    ChatMessage,
    SamplingParams,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from trexo.types.ids import RequestId

RID = RequestId("msg_test")
USER = {"role": "user", "content": "hi"}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"name": "get_weather", "description": "The weather in a city", "input_schema": SCHEMA}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 64, "messages": [USER], **fields}


def parse(**fields: Any) -> MessagesRequest:
    return parse_messages_request(body(**fields), RID)


def refused(raw: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_messages_request(raw, RID)
    assert caught.value.status == 400
    return caught.value


def test_minimal_request() -> None:
    parsed = parse()
    assert (parsed.model_id, parsed.message_id, parsed.stream) == ("m", RID, False)
    assert parsed.requested_max_tokens == 64
    assert parsed.generation.messages == (ChatMessage("user", "hi"),)
    # Greedy unless asked otherwise, as in every dialect (Anthropic's default is 1.0).
    assert parsed.generation.params == SamplingParams(max_tokens=64)
    assert parsed.generation.tools == ()
    assert parsed.generation.response_format is None


def test_message_ids_look_like_anthropics() -> None:
    ids = {new_message_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(i.startswith("msg_") and int(i.removeprefix("msg_"), 16) >= 0 for i in ids)
    assert parse_messages_request(body()).message_id.startswith("msg_")


def test_sampling_and_stream() -> None:
    parsed = parse(
        temperature=0.7, top_p=0.9, top_k=40, stop_sequences=["END", "\n\n"], stream=True
    )
    params = parsed.generation.params
    assert (params.temperature, params.top_p, params.top_k) == (0.7, 0.9, 40)
    assert params.stop == ("END", "\n\n")
    assert parsed.stream


@pytest.mark.parametrize(
    ("system", "text"),
    [
        ("Be brief.", "Be brief."),
        ([{"type": "text", "text": "Be brief."}], "Be brief."),
        (
            [
                {"type": "text", "text": "One."},
                {"type": "text", "text": "Two.", "cache_control": {}},
            ],
            "One.\n\nTwo.",
        ),
    ],
)
def test_system_comes_first(system: Any, text: str) -> None:
    messages = parse(system=system).generation.messages
    assert messages == (ChatMessage("system", text), ChatMessage("user", "hi"))


def test_text_blocks_are_joined_so_words_never_run_together() -> None:
    content = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    messages = parse(messages=[{"role": "user", "content": content}]).generation.messages
    assert messages == (ChatMessage("user", "first\n\nsecond"),)


def test_a_tool_round_trip_becomes_calls_and_tool_messages() -> None:
    conversation = [
        USER,
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": SCHEMA},
                {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "no clock"}],
                    "is_error": True,
                },
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    messages = parse(messages=conversation).generation.messages
    assert messages is not None
    _, assistant, sunny, failed, question = messages
    assert assistant.role == "assistant"
    assert assistant.content == "Let me look."
    first, second = assistant.tool_calls
    assert (first.id, first.name, json.loads(first.arguments)) == ("toolu_1", "get_weather", SCHEMA)
    assert second == ToolCall("toolu_2", "get_time", "{}")
    assert sunny == ChatMessage("tool", "sunny", tool_call_id="toolu_1", name="get_weather")
    assert failed == ChatMessage(
        "tool", TOOL_ERROR_PREFIX + "no clock", tool_call_id="toolu_2", name="get_time"
    )
    assert question == ChatMessage("user", "And tomorrow?")


def test_a_result_for_an_unknown_call_has_no_function_name() -> None:
    result = {"type": "tool_result", "tool_use_id": "elsewhere"}
    messages = parse(messages=[{"role": "user", "content": [result]}]).generation.messages
    assert messages == (ChatMessage("tool", "", tool_call_id="elsewhere"),)


def test_tools() -> None:
    generation = parse(
        tools=[WEATHER, {"name": "now", "input_schema": {"type": "object"}}]
    ).generation
    weather, now = generation.tools
    assert (weather.name, weather.description, json.loads(weather.parameters)) == (
        "get_weather",
        "The weather in a city",
        SCHEMA,
    )
    assert now == ToolSpec("now", None, '{"type": "object"}')
    assert generation.tool_choice == ToolChoice()
    assert generation.parallel_tool_calls


@pytest.mark.parametrize(
    ("tool_choice", "expected", "parallel"),
    [
        ({"type": "auto"}, ToolChoice("auto"), True),
        ({"type": "any"}, ToolChoice("required"), True),
        ({"type": "none"}, ToolChoice("none"), True),
        ({"type": "tool", "name": "get_weather"}, ToolChoice("function", "get_weather"), True),
        ({"type": "auto", "disable_parallel_tool_use": True}, ToolChoice("auto"), False),
        ({"type": "any", "disable_parallel_tool_use": False}, ToolChoice("required"), True),
    ],
)
def test_tool_choice(tool_choice: Any, expected: ToolChoice, parallel: bool) -> None:
    generation = parse(tools=[WEATHER], tool_choice=tool_choice).generation
    assert (generation.tool_choice, generation.parallel_tool_calls) == (expected, parallel)


@pytest.mark.parametrize(
    ("thinking", "switches"),
    [
        ({"type": "enabled", "budget_tokens": 1024}, {"enable_thinking": True}),
        ({"type": "disabled"}, {"enable_thinking": False}),
        (None, {"enable_thinking": False}),  # Anthropic's default: no thinking
        ({"type": "adaptive"}, None),  # the model's own default
        ({"type": "adaptive", "display": "summarized"}, None),
    ],
)
def test_thinking_reaches_the_template_as_enable_thinking(
    thinking: Any, switches: dict[str, Any] | None
) -> None:
    parsed = parse(max_tokens=2048, thinking=thinking)
    assert parsed.generation.messages == (ChatMessage("user", "hi"),)
    kwargs = parsed.generation.template_kwargs
    assert (json.loads(kwargs) if kwargs else None) == switches
    assert parsed.show_thinking


def test_effort_is_the_templates_reasoning_effort() -> None:
    kwargs = parse(thinking={"type": "adaptive"}, output_config={"effort": "high"})
    assert json.loads(kwargs.generation.template_kwargs or "") == {"reasoning_effort": "high"}


def test_omitted_thinking_is_shown_empty() -> None:
    thinking = {"type": "enabled", "budget_tokens": 1024, "display": "omitted"}
    assert not parse(max_tokens=2048, thinking=thinking).show_thinking


@pytest.mark.parametrize(
    ("thinking", "param"),
    [
        ({"type": "enabled"}, "thinking.budget_tokens"),
        ({"type": "enabled", "budget_tokens": 1023}, "thinking.budget_tokens"),
        ({"type": "enabled", "budget_tokens": 64}, "thinking.budget_tokens"),
        ({"type": "enabled", "budget_tokens": 4096}, "max_tokens"),  # not below max_tokens
        ({"type": "enabled", "budget_tokens": 1024, "display": "full"}, "thinking.display"),
        ({"type": "disabled", "budget_tokens": 1024}, "thinking.budget_tokens"),
        ({"type": "sometimes"}, "thinking.type"),
    ],
)
def test_thinking_is_checked_as_anthropic_checks_it(thinking: Any, param: str) -> None:
    assert refused(body(max_tokens=2048, thinking=thinking)).param == param


def test_replayed_thinking_blocks_are_the_turns_reasoning() -> None:
    turn = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Think.", "signature": "abc"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Said."},
        ],
    }
    messages = parse(messages=[USER, turn, USER]).generation.messages or ()
    assert messages[1] == ChatMessage("assistant", "Said.", reasoning="Think.")


def test_output_config_format_is_a_json_schema_response_format() -> None:
    generation = parse(
        output_config={"format": {"type": "json_schema", "schema": SCHEMA}, "effort": "low"}
    ).generation
    assert generation.response_format is not None
    assert generation.response_format.kind == "json_schema"
    assert json.loads(generation.response_format.schema or "") == SCHEMA
    assert parse(output_config={"effort": "high"}).generation.response_format is None


def test_ignored_fields_are_accepted() -> None:
    parsed = parse(
        metadata={"user_id": "u-1"},
        service_tier="auto",
        cache_control={"type": "ephemeral"},
        inference_geo="eu",
        speed="standard",
        user_profile_id="p",
        workspace_id="w",
        system=None,
    )
    assert parsed.generation.messages == (ChatMessage("user", "hi"),)


def test_count_tokens_takes_the_prompt_fields_only() -> None:
    counted = parse_count_tokens_request(
        {"model": "m", "messages": [USER], "system": "s", "tools": [WEATHER]}
    )
    assert counted.model_id == "m"
    assert counted.generation.messages == (ChatMessage("system", "s"), ChatMessage("user", "hi"))
    assert [tool.name for tool in counted.generation.tools] == ["get_weather"]
    with pytest.raises(ApiError) as caught:
        parse_count_tokens_request(body())  # max_tokens is not a prompt field
    assert caught.value.param == "max_tokens"
    assert "Extra inputs are not permitted" in caught.value.message


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}

BAD_BODIES: list[tuple[Any, str | None]] = [
    # (body, the param the error names)
    ([], None),
    ({"model": "m", "messages": [USER]}, "max_tokens"),
    (body(max_tokens=0), "max_tokens"),
    (body(max_tokens=1.5), "max_tokens"),
    (body(max_tokens=None), "max_tokens"),
    (body(model=""), "model"),
    ({"max_tokens": 5, "messages": [USER]}, "model"),
    (body(messages=[]), "messages"),
    (body(messages="hi"), "messages"),
    (body(temperature=1.5), "temperature"),
    (body(top_p=-0.1), "top_p"),
    (body(top_k=-1), "top_k"),
    (body(stream="yes"), "stream"),
    (body(stop_sequences="END"), "stop_sequences"),
    (body(stop_sequences=[""]), "stop_sequences[0]"),
    (body(stop_sequences=["x"] * (MAX_STOP_SEQUENCES + 1)), "stop_sequences"),
    (body(n=2), "n"),
    (body(frequency_penalty=0.5), "frequency_penalty"),
    (body(container="c-1"), "container"),
    (body(mcp_servers=[{"type": "url", "url": "http://x", "name": "x"}]), "mcp_servers"),
    (body(metadata={"user_id": "u", "extra": 1}), "metadata.extra"),
    (body(messages=[{"role": "tool", "content": "x"}]), "messages[0].role"),
    (body(messages=[{"role": "user"}]), "messages[0].content"),
    (body(messages=[{"role": "user", "content": "hi", "name": "x"}]), "messages[0].name"),
    (body(messages=[{"role": "user", "content": 7}]), "messages[0].content"),
    (body(messages=[{"role": "user", "content": [IMAGE]}]), "messages[0].content[0].type"),
    (
        body(messages=[{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]),
        "messages[0].content[0].x",
    ),
    (body(messages=[{"role": "user", "content": "\ud800"}]), "messages[0].content"),
    (
        body(
            messages=[
                {
                    "role": "assistant",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}],
                }
            ]
        ),
        "messages[0].content[0].type",
    ),
    (
        body(messages=[{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]),
        "messages[0].content[0].type",
    ),
    (
        body(
            messages=[
                {"role": "assistant", "content": [{"type": "thinking", "thinking": 1}]},
            ]
        ),
        "messages[0].content[0].thinking",
    ),
    (
        body(
            messages=[
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}
            ]
        ),
        "messages[0].content[0].input",
    ),
    (
        body(
            messages=[
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}],
                }
            ]
        ),
        "messages[0].content[0].input",
    ),
    (
        body(messages=[{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]),
        "messages[0].content[0].tool_use_id",
    ),
    (
        body(
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": [IMAGE]}],
                }
            ]
        ),
        "messages[0].content[0].content[0].type",
    ),
    (body(system=[IMAGE]), "system[0].type"),
    (body(system=3), "system"),
    (body(tools={"name": "x"}), "tools"),
    (body(tools=[{"name": "get_weather"}]), "tools[0].input_schema"),
    (body(tools=[{**WEATHER, "input_schema": {"type": "string"}}]), "tools[0].input_schema.type"),
    (body(tools=[{**WEATHER, "name": "no spaces"}]), "tools[0].name"),
    (body(tools=[{**WEATHER, "parameters": {}}]), "tools[0].parameters"),
    (body(tools=[WEATHER, WEATHER]), "tools"),
    (body(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools[0].type"),
    (body(tool_choice={"type": "any"}), "tool_choice"),
    (body(tool_choice="auto"), "tool_choice"),
    (body(tools=[WEATHER], tool_choice={"type": "some"}), "tool_choice.type"),
    (body(tools=[WEATHER], tool_choice={"type": "tool"}), "tool_choice.name"),
    (body(tools=[WEATHER], tool_choice={"type": "tool", "name": "other"}), "tool_choice.name"),
    (
        body(tools=[WEATHER], tool_choice={"type": "none", "disable_parallel_tool_use": True}),
        "tool_choice.disable_parallel_tool_use",
    ),
    (body(thinking={"type": "sometimes"}), "thinking.type"),
    (body(thinking={"type": "disabled", "budget_tokens": 1024}), "thinking.budget_tokens"),
    (body(output_config={"format": {"type": "text"}}), "output_config.format.type"),
    (body(output_config={"effort": "extreme"}), "output_config.effort"),
]


@pytest.mark.parametrize(("raw", "param"), BAD_BODIES)
def test_bad_bodies_are_400s_naming_the_field(raw: Any, param: str | None) -> None:
    assert refused(raw).param == param


def test_unknown_fields_are_worded_as_anthropic_words_them() -> None:
    error = refused(body(stop=["x"]))
    assert error.message == "stop: Extra inputs are not permitted"
