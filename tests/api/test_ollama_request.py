"""Parsing Ollama `/api/chat`, `/api/generate` and `/api/show` bodies (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trexo.api.errors import ApiError
from trexo.api.ollama_request import (
    IGNORED_OPTIONS,
    MAX_STOP_SEQUENCES,
    REQUEST_ID_PREFIX,
    model_name,
    parse_chat,
    parse_generate,
    parse_options,
    parse_show,
)
from trexo.types.generation import (
    ChatMessage,
    ResponseFormat,
    SamplingParams,
    ToolCall,
    ToolSpec,
)
from trexo.types.ids import RequestId

USER = {"role": "user", "content": "hi"}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"age": {"type": "integer"}},
    "required": ["age"],
}
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [USER], **extra}


def refused(body: Any, param: str, *, generate: bool = False) -> ApiError:
    with pytest.raises(ApiError) as caught:
        (parse_generate if generate else parse_chat)(body)
    assert caught.value.status == 400
    assert caught.value.param == param, caught.value.message
    return caught.value


# --- chat ----------------------------------------------------------------------------------------


def test_a_plain_chat_streams_by_default_with_trexos_sampling_defaults() -> None:
    request = parse_chat(chat())
    assert request.model == "m"
    assert request.stream is True
    assert request.request_id.startswith(REQUEST_ID_PREFIX)
    assert request.requested_max_tokens is None
    generation = request.generation
    assert generation is not None
    assert generation.request_id == request.request_id
    assert generation.messages == (ChatMessage("user", "hi"),)
    assert generation.params == SamplingParams()
    assert (generation.tools, generation.response_format, generation.logprobs) == ((), None, None)


def test_stream_false_and_a_given_request_id() -> None:
    request = parse_chat(chat(stream=False), RequestId("r-1"))
    assert request.stream is False
    assert request.request_id == "r-1"


def test_options_map_onto_sampling_params() -> None:
    options = {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "seed": 42,
        "num_predict": 12,
        "stop": ["\n", "user:"],
        "repeat_penalty": 1.1,
    }
    request = parse_chat(chat(options=options))
    assert request.generation is not None
    assert request.generation.params == SamplingParams(
        max_tokens=12,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        seed=42,
        repetition_penalty=1.1,
        stop=("\n", "user:"),
    )
    assert request.requested_max_tokens == 12


@pytest.mark.parametrize("value", [-1, -2])
def test_num_predict_without_limit_is_what_fits(value: int) -> None:
    params, requested, _ = parse_options({"num_predict": value})
    assert requested is None
    assert params.max_tokens == SamplingParams().max_tokens


@pytest.mark.parametrize("value", [0, -3, 1.5, "10"])
def test_num_predict_must_be_a_count(value: Any) -> None:
    refused(chat(options={"num_predict": value}), "options.num_predict")


def test_seed_minus_one_is_random() -> None:
    assert parse_options({"seed": -1})[0].seed is None
    refused(chat(options={"seed": -2}), "options.seed")


def test_a_single_stop_string_is_accepted() -> None:
    assert parse_options({"stop": "END"})[0].stop == ("END",)


def test_stops_are_bounded_and_non_empty() -> None:
    refused(chat(options={"stop": ["x"] * (MAX_STOP_SEQUENCES + 1)}), "options.stop")
    refused(chat(options={"stop": ["ok", ""]}), "options.stop[1]")
    refused(chat(options={"stop": [3]}), "options.stop[0]")


def test_options_that_tune_ollamas_runtime_are_ignored() -> None:
    options = dict.fromkeys(IGNORED_OPTIONS, 1)
    assert parse_options(options) == parse_options({})


@pytest.mark.parametrize(
    ("name", "neutral", "other"),
    [
        ("mirostat", 0, 2),
        ("typical_p", 1.0, 0.7),
        ("tfs_z", 1, 0.5),
        ("presence_penalty", 0.0, 1.5),
        ("frequency_penalty", 0, 1.0),
    ],
)
def test_sampler_knobs_trexo_lacks_are_accepted_and_ignored_as_ollama_does(
    name: str, neutral: float, other: float
) -> None:
    assert parse_options({name: neutral}) == parse_options({})  # asks for nothing: not noted
    params, requested, ignored = parse_options({name: other})
    assert (params, requested) == parse_options({})[:2]
    assert ignored == (name,)  # the view logs it


def test_an_unknown_option_is_ignored_and_named() -> None:
    params, _, ignored = parse_options({"temprature": 0.5, "temperature": 0.2})
    assert params.temperature == 0.2
    assert ignored == ("temprature",)
    request = parse_chat(chat(options={"mirostat_eta": 0.1}))
    assert request.ignored_options == ("mirostat_eta",)


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"top_k": "40"}, "options.top_k"),
        ({"top_p": 1.5}, "options.top_p"),
        ({"temperature": -0.1}, "options.temperature"),
        ({"min_p": True}, "options.min_p"),
        ({"repeat_penalty": 0}, "options.repeat_penalty"),
    ],
)
def test_bad_option_values_name_the_option(options: dict[str, Any], param: str) -> None:
    refused(chat(options=options), param)


def test_options_must_be_an_object() -> None:
    refused(chat(options=[1]), "options")


def test_format_json_and_json_schema() -> None:
    assert parse_chat(chat(format="")).generation.response_format is None  # type: ignore[union-attr]
    json_mode = parse_chat(chat(format="json")).generation
    assert json_mode is not None
    assert json_mode.response_format == ResponseFormat("json_object")
    schema = parse_chat(chat(format=SCHEMA)).generation
    assert schema is not None
    assert schema.response_format is not None
    assert schema.response_format.kind == "json_schema"
    assert json.loads(schema.response_format.schema or "") == SCHEMA


@pytest.mark.parametrize("value", ["xml", 3, ["json"]])
def test_other_formats_are_refused(value: Any) -> None:
    refused(chat(format=value), "format")


@pytest.mark.parametrize(
    ("think", "switches"),
    [
        (None, None),  # the template's default: thinking models think
        (True, {"enable_thinking": True}),
        (False, {"enable_thinking": False}),
        ("high", {"reasoning_effort": "high"}),  # gpt-oss's levels
    ],
)
def test_think_reaches_the_template(think: Any, switches: dict[str, Any] | None) -> None:
    for generation in (
        parse_chat(chat(think=think)).generation,
        parse_generate({"model": "m", "prompt": "x", "think": think}).generation,
    ):
        assert generation is not None
        kwargs = generation.template_kwargs
        assert (json.loads(kwargs) if kwargs else None) == switches
    raw = parse_generate({"model": "m", "prompt": "x", "raw": True, "think": True}).generation
    assert raw is not None and raw.template_kwargs is None  # no template


@pytest.mark.parametrize("think", ["max", 1, ["low"]])
def test_other_think_values_are_refused(think: Any) -> None:
    refused(chat(think=think), "think")


def test_a_replayed_turns_thinking_reaches_the_template() -> None:
    turn = {"role": "assistant", "content": "Hi.", "thinking": "Greet back."}
    generation = parse_chat(chat(messages=[USER, turn, USER])).generation
    assert generation is not None and generation.messages is not None
    assert generation.messages[1] == ChatMessage("assistant", "Hi.", reasoning="Greet back.")


@pytest.mark.parametrize("keep_alive", ["5m", 0, -1, 300.5])
def test_keep_alive_is_accepted_and_ignored(keep_alive: Any) -> None:
    request_id = RequestId("r-1")
    assert parse_chat(chat(keep_alive=keep_alive), request_id) == parse_chat(chat(), request_id)


def test_keep_alive_must_be_a_duration() -> None:
    refused(chat(keep_alive=[5]), "keep_alive")


def test_logprobs() -> None:
    request = parse_chat(chat(logprobs=True, top_logprobs=3))
    assert request.generation is not None
    assert request.generation.logprobs == 3
    refused(chat(top_logprobs=3), "top_logprobs")


def test_tools_and_a_tool_round_trip() -> None:
    messages = [
        USER,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    ]
    request = parse_chat({"model": "m", "messages": messages, "tools": [WEATHER]})
    generation = request.generation
    assert generation is not None
    [tool] = generation.tools
    assert tool == ToolSpec(
        "get_weather",
        "The weather in a city",
        json.dumps(WEATHER["function"]["parameters"]),
    )
    _, assistant, result = generation.messages or ()
    [call] = assistant.tool_calls
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert call.id == "call_1_0"  # stable: the same conversation renders the same prompt
    assert (result.role, result.content, result.name) == ("tool", "sunny", "get_weather")


def test_tool_calls_keep_given_ids_and_accept_json_text_arguments() -> None:
    call = {"id": "call_x", "function": {"name": "f", "arguments": '{"a": 1}'}}
    tool = {"role": "tool", "content": "1", "name": "f", "tool_call_id": "call_x"}
    messages = [USER, {"role": "assistant", "tool_calls": [call]}, tool]
    generation = parse_chat({"model": "m", "messages": messages}).generation
    assert generation is not None
    _, assistant, result = generation.messages or ()
    assert assistant.tool_calls == (ToolCall("call_x", "f", '{"a": 1}'),)
    assert assistant.content == ""
    assert (result.name, result.tool_call_id) == ("f", "call_x")


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "bot", "content": "x"}, "messages[0].role"),
        ({"content": "x"}, "messages[0].role"),
        ({"role": "user", "content": ["x"]}, "messages[0].content"),
        ({"role": "user", "content": "x", "images": ["aGk="]}, "messages[0].images"),
        (
            {"role": "user", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
            "messages[0].tool_calls",
        ),
        (
            {"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]},
            "messages[0].tool_calls[0].function.name",
        ),
        (
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 1}}]},
            "messages[0].tool_calls[0].function.arguments",
        ),
        ("hi", "messages[0]"),
    ],
)
def test_bad_messages_name_the_field(message: Any, param: str) -> None:
    refused({"model": "m", "messages": [message]}, param)


def test_replayed_fields_of_messages_are_ignored() -> None:
    message = {"role": "assistant", "content": "ok", "thinking": "", "images": []}
    generation = parse_chat({"model": "m", "messages": [USER, message]}).generation
    assert generation is not None
    assert generation.messages == (ChatMessage("user", "hi"), ChatMessage("assistant", "ok"))


def test_no_messages_is_a_load_request() -> None:
    for body in ({"model": "m"}, {"model": "m", "messages": [], "stream": False}):
        request = parse_chat(body)
        assert request.generation is None
        assert request.stream is ("stream" not in body)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [USER]}, "model"),
        ({"model": "", "messages": [USER]}, "model"),
        ({"model": 3, "messages": [USER]}, "model"),
        (chat(messages={"role": "user"}), "messages"),
        (chat(stream="yes"), "stream"),
        (chat(tools={"a": 1}), "tools"),
        (chat(prompt="hi"), "prompt"),
        (chat(temperature=0.5), "temperature"),
    ],
)
def test_bad_chat_bodies_name_the_field(body: dict[str, Any], param: str) -> None:
    refused(body, param)


def test_the_body_must_be_an_object() -> None:
    with pytest.raises(ApiError) as caught:
        parse_chat([1])
    assert caught.value.status == 400


# --- generate ------------------------------------------------------------------------------------


def test_a_prompt_is_a_user_turn_of_the_chat_template() -> None:
    request = parse_generate({"model": "m", "prompt": "Why?", "stream": False})
    assert request.stream is False
    generation = request.generation
    assert generation is not None
    assert (generation.messages, generation.prompt) == ((ChatMessage("user", "Why?"),), None)


def test_a_system_prompt_comes_first() -> None:
    generation = parse_generate({"model": "m", "prompt": "Why?", "system": "Be brief."}).generation
    assert generation is not None
    assert generation.messages == (ChatMessage("system", "Be brief."), ChatMessage("user", "Why?"))


def test_a_raw_prompt_is_passed_as_is() -> None:
    body = {"model": "m", "prompt": "[INST] hi [/INST]", "raw": True, "options": {"seed": 1}}
    generation = parse_generate(body).generation
    assert generation is not None
    assert (generation.messages, generation.prompt) == (None, "[INST] hi [/INST]")
    assert generation.params.seed == 1


def test_a_raw_prompt_takes_no_system_prompt() -> None:
    refused({"model": "m", "prompt": "x", "raw": True, "system": "s"}, "system", generate=True)


def test_no_prompt_is_a_load_request() -> None:
    for body in ({"model": "m"}, {"model": "m", "prompt": ""}):
        assert parse_generate(body).generation is None


def test_empty_values_of_refused_fields_ask_for_nothing() -> None:
    body = {"model": "m", "prompt": "x", "suffix": "", "images": [], "context": [], "template": ""}
    assert parse_generate(body).generation is not None


@pytest.mark.parametrize(
    ("field", "value"),
    [("suffix", "return x"), ("images", ["aGk="]), ("template", "{{ .Prompt }}"), ("context", [1])],
)
def test_fields_trexo_cannot_honour_are_refused(field: str, value: Any) -> None:
    error = refused({"model": "m", "prompt": "x", field: value}, field, generate=True)
    assert error.code == "unsupported_parameter"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x"}, "model"),
        ({"model": "m", "prompt": 3}, "prompt"),
        ({"model": "m", "prompt": "x", "raw": "yes"}, "raw"),
        ({"model": "m", "prompt": "x", "tools": [WEATHER]}, "tools"),
        ({"model": "m", "prompt": "x", "messages": [USER]}, "messages"),
        ({"model": "m", "prompt": "x", "think": "yes"}, "think"),
    ],
)
def test_bad_generate_bodies_name_the_field(body: dict[str, Any], param: str) -> None:
    refused(body, param, generate=True)


# --- names and show ------------------------------------------------------------------------------


def test_the_latest_tag_is_implicit() -> None:
    assert model_name("llama:latest", {"llama"}) == "llama"
    assert model_name("llama:latest", {"llama:latest", "llama"}) == "llama:latest"
    assert model_name("llama:7b", {"llama"}) == "llama:7b"
    assert model_name("org/model", {"org/model"}) == "org/model"


def test_show_names_its_model() -> None:
    assert parse_show({"model": "m", "verbose": True}) == "m"
    assert parse_show({"name": "old"}) == "old"


@pytest.mark.parametrize(
    ("body", "param"),
    [({}, "model"), ({"model": ""}, "model"), ({"model": "m", "x": 1}, "x")],
)
def test_bad_show_bodies(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_show(body)
    assert (caught.value.status, caught.value.param) == (400, param)
