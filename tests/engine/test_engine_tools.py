"""Tools, tool choices and log probabilities through the real engine and the scripted model
that calls a tool (`trexo.engine.scripted_model`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from trexo.engine.engine import Engine
from trexo.engine.scripted_model import (
    SCRIPTED_PLAIN_ANSWER,
    SCRIPTED_TOOL,
    SCRIPTED_TOOL_ARGUMENTS,
    SCRIPTED_TOOL_NAME,
    SCRIPTED_TOOL_RESULT_ANSWER,
)
from trexo.types.chunks import Chunk
from trexo.types.generation import (
    ChatMessage,
    GenerationRequest,
    ResponseFormat,
    SamplingParams,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from trexo.types.ids import RequestId

RID = RequestId("tools-1")
WEATHER = SCRIPTED_TOOL
ASK = ChatMessage("user", "What is the weather in Paris?")


@pytest.fixture(scope="module")
def tools_engine(tools_model: Path) -> Engine:
    return Engine.load(tools_model)


def run(engine: Engine, *messages: ChatMessage, **fields: Any) -> list[Chunk]:
    request = GenerationRequest(RID, messages=messages or (ASK,), **fields)
    chunks = list(engine.generate(request, lambda: False))
    assert [c.finish_reason is not None for c in chunks].count(True) == 1
    return chunks


def calls(chunks: list[Chunk]) -> list[ToolCall]:
    return [call for chunk in chunks for call in chunk.tool_calls]


def text(chunks: list[Chunk]) -> str:
    return "".join(chunk.text for chunk in chunks)


def test_offered_a_tool_the_model_calls_it(tools_engine: Engine) -> None:
    chunks = run(tools_engine, tools=(WEATHER,))
    (call,) = calls(chunks)
    assert (call.name, json.loads(call.arguments)) == (SCRIPTED_TOOL_NAME, SCRIPTED_TOOL_ARGUMENTS)
    assert text(chunks) == ""  # the call's markup is not text
    assert chunks[-1].finish_reason == "tool_calls"


def test_the_tool_result_round_trips_into_the_prompt(tools_engine: Engine) -> None:
    asked = ChatMessage(
        "assistant", "", tool_calls=(ToolCall("call_1", SCRIPTED_TOOL_NAME, '{"city": "Paris"}'),)
    )
    answer = ChatMessage("tool", "sunny, 24 C", tool_call_id="call_1", name=SCRIPTED_TOOL_NAME)
    chunks = run(tools_engine, ASK, asked, answer, tools=(WEATHER,))
    assert (text(chunks), calls(chunks)) == (SCRIPTED_TOOL_RESULT_ANSWER, [])
    assert chunks[-1].finish_reason == "stop"


def test_tool_choice_none_hides_the_tools(tools_engine: Engine) -> None:
    chunks = run(tools_engine, tools=(WEATHER,), tool_choice=ToolChoice("none"))
    assert (text(chunks), calls(chunks)) == (SCRIPTED_PLAIN_ANSWER, [])


@pytest.mark.parametrize("choice", [ToolChoice("required"), ToolChoice("function", "get_weather")])
def test_a_required_call_starts_the_answer_inside_a_call(
    tools_engine: Engine, choice: ToolChoice
) -> None:
    free = run(tools_engine, tools=(WEATHER,))
    forced = run(tools_engine, tools=(WEATHER,), tool_choice=choice)
    assert [c.name for c in calls(forced)] == [SCRIPTED_TOOL_NAME]
    # The prompt already holds the call's start marker: one token fewer to generate.
    forced_usage, free_usage = forced[-1].usage, free[-1].usage
    assert forced_usage is not None and free_usage is not None
    assert forced_usage.prompt_tokens == free_usage.prompt_tokens + 1
    assert forced_usage.completion_tokens == free_usage.completion_tokens - 1


def test_a_call_to_a_function_not_offered_is_text(tools_engine: Engine) -> None:
    other = ToolSpec("get_time")
    chunks = run(tools_engine, tools=(other,))
    assert calls(chunks) == []
    assert SCRIPTED_TOOL_NAME in text(chunks)
    assert chunks[-1].finish_reason == "stop"


def test_log_probabilities_come_one_per_token_with_ranked_rivals(tools_engine: Engine) -> None:
    chunks = run(tools_engine, logprobs=3)
    entries = [entry for chunk in chunks for entry in chunk.logprobs]
    assert len(entries) == sum(len(chunk.token_ids) for chunk in chunks)
    for entry in entries:
        assert len(entry.top) == 3
        assert [r.logprob for r in entry.top] == sorted(
            (r.logprob for r in entry.top), reverse=True
        )
        # Greedy decoding: the chosen token is the most likely one.
        assert entry.top[0].token == entry.token
        assert math.isclose(entry.top[0].logprob, entry.logprob)
        assert entry.logprob <= 0.0
        assert bytes(entry.bytes).decode() == entry.token
    assert "".join(e.token for e in entries[:-1]) == SCRIPTED_PLAIN_ANSWER  # the last is EOS
    assert all(chunk.logprobs == () for chunk in run(tools_engine))


def test_a_model_without_a_tool_format_refuses_tools(engine: Engine) -> None:
    request = GenerationRequest(RID, messages=(ASK,), tools=(WEATHER,))
    with pytest.raises(ValueError, match="tool-call format"):
        engine.admit(request)
    # Unless the tools are not to be used.
    engine.admit(
        GenerationRequest(RID, messages=(ASK,), tools=(WEATHER,), tool_choice=ToolChoice("none"))
    )


@pytest.mark.parametrize(
    "response_format",
    [
        ResponseFormat("json_object"),
        ResponseFormat(
            "json_schema",
            json.dumps(
                {
                    "type": "object",
                    "properties": {"ok": {"type": "boolean"}},
                    "required": ["ok"],
                    "additionalProperties": False,
                }
            ),
        ),
    ],
)
def test_a_response_format_constrains_the_output_to_json(
    tools_engine: Engine, response_format: ResponseFormat
) -> None:
    chunks = run(
        tools_engine, response_format=response_format, params=SamplingParams(max_tokens=64)
    )
    assert SCRIPTED_PLAIN_ANSWER not in text(chunks)  # what the model says unconstrained
    if chunks[-1].finish_reason == "stop":
        value = json.loads(text(chunks))
        assert isinstance(value, dict)
        if response_format.kind == "json_schema":
            assert set(value) == {"ok"} and isinstance(value["ok"], bool)
    else:  # a weak model may not close its JSON within max_tokens; it is cut, not wrong
        assert chunks[-1].finish_reason == "length"
        assert text(chunks).startswith("{")


def test_an_unusable_schema_is_refused(tools_engine: Engine) -> None:
    bad = GenerationRequest(
        RID, messages=(ASK,), response_format=ResponseFormat("json_schema", '{"type": 5}')
    )
    with pytest.raises(ValueError, match="schema"):
        list(tools_engine.generate(bad, lambda: False))


def test_the_final_chunk_names_the_stop_sequence_that_ended_it(tools_engine: Engine) -> None:
    chunks = run(tools_engine, params=SamplingParams(stop=("zzz", "tools")))
    assert text(chunks) == SCRIPTED_PLAIN_ANSWER[: SCRIPTED_PLAIN_ANSWER.index("tools")]
    assert (chunks[-1].finish_reason, chunks[-1].stop_sequence) == ("stop", "tools")
    assert run(tools_engine)[-1].stop_sequence is None  # the model ended its turn itself


def test_a_last_assistant_turn_can_be_continued(tools_engine: Engine) -> None:
    begun = SCRIPTED_PLAIN_ANSWER[: SCRIPTED_PLAIN_ANSWER.index(" no")]
    prefill = ChatMessage("assistant", begun)
    continued = run(tools_engine, ASK, prefill, continue_final=True)
    assert text(continued) == SCRIPTED_PLAIN_ANSWER[len(begun) :]
    # Not continued, the same messages end that turn and open a new one.
    assert text(run(tools_engine, ASK, prefill)) == SCRIPTED_PLAIN_ANSWER
    with pytest.raises(ValueError, match="assistant"):
        GenerationRequest(RID, messages=(ASK,), continue_final=True)
