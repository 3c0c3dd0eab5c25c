"""End to end with the official openai client, unchanged: tool calling, log probabilities and
text completions from a real `trexo run` serving the scripted tool-calling demo model."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
import trio

from trexo.engine.scripted_model import (
    SCRIPTED_PLAIN_ANSWER,
    SCRIPTED_TOOL_ARGUMENTS,
    SCRIPTED_TOOL_NAME,
    SCRIPTED_TOOL_RESULT_ANSWER,
)

from .conftest import OPENAI_WEATHER, QUESTION, TOOLS_MODEL
from .shared_node import SharedNode

MODEL = TOOLS_MODEL
TIMEOUT_S = 60.0
ASK = [{"role": "user", "content": QUESTION}]
WEATHER = OPENAI_WEATHER


@pytest.fixture
def node(tools_node: SharedNode) -> SharedNode:
    return tools_node


def client(node: SharedNode) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0)


def assert_scripted_call(name: str, arguments: str) -> None:
    assert (name, json.loads(arguments)) == (SCRIPTED_TOOL_NAME, SCRIPTED_TOOL_ARGUMENTS)


async def test_a_tool_call_and_its_result_make_a_full_round_trip(node: SharedNode) -> None:
    c = client(node)
    with trio.fail_after(TIMEOUT_S):
        first = await c.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        (call,) = choice.message.tool_calls or []
        assert call.type == "function"
        assert_scripted_call(call.function.name, call.function.arguments)

        result = {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'}
        messages = [*ASK, choice.message.model_dump(exclude_none=True), result]
        second = await c.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER])
    assert second.choices[0].message.content == SCRIPTED_TOOL_RESULT_ANSWER
    assert second.choices[0].finish_reason == "stop"
    assert second.usage is not None and first.usage is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result


async def test_streamed_tool_calls_come_as_openai_deltas(node: SharedNode) -> None:
    c = client(node)
    with trio.fail_after(TIMEOUT_S):
        stream = await c.chat.completions.create(
            model=MODEL, messages=ASK, tools=[WEATHER], stream=True
        )
        deltas = [chunk.choices[0] async for chunk in stream if chunk.choices]
        # The client library's own accumulator builds the same call from the deltas.
        async with c.chat.completions.stream(model=MODEL, messages=ASK, tools=[WEATHER]) as helper:
            final = await helper.get_final_completion()
    calls = [call for d in deltas for call in d.delta.tool_calls or []]
    (call,) = calls
    assert (call.index, call.type) == (0, "function")
    assert call.id and call.function is not None
    assert_scripted_call(call.function.name or "", call.function.arguments or "")
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["tool_calls"]
    (built,) = final.choices[0].message.tool_calls or []
    assert_scripted_call(built.function.name, built.function.arguments)


@pytest.mark.parametrize(
    "tool_choice",
    [
        "none",
        "required",
        {"type": "function", "function": {"name": SCRIPTED_TOOL_NAME}},
    ],
)
async def test_tool_choice(node: SharedNode, tool_choice: Any) -> None:
    with trio.fail_after(TIMEOUT_S):
        response = await client(node).chat.completions.create(
            model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=tool_choice
        )
    message = response.choices[0].message
    if tool_choice == "none":
        assert (message.content, message.tool_calls) == (SCRIPTED_PLAIN_ANSWER, None)
    else:
        (call,) = message.tool_calls or []
        assert_scripted_call(call.function.name, call.function.arguments)


async def test_logprobs_stream_and_not(node: SharedNode) -> None:
    c = client(node)
    with trio.fail_after(TIMEOUT_S):
        whole = await c.chat.completions.create(
            model=MODEL, messages=ASK, logprobs=True, top_logprobs=2
        )
        stream = await c.chat.completions.create(
            model=MODEL, messages=ASK, logprobs=True, top_logprobs=2, stream=True
        )
        streamed = [
            entry
            async for chunk in stream
            if chunk.choices and chunk.choices[0].logprobs
            for entry in chunk.choices[0].logprobs.content or []
        ]
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    tokens = [entry.token for entry in logprobs.content]
    assert "".join(tokens).startswith(SCRIPTED_PLAIN_ANSWER)
    assert all(len(entry.top_logprobs) == 2 for entry in logprobs.content)
    assert [entry.token for entry in streamed] == tokens


async def test_text_completions_stream_and_not(node: SharedNode) -> None:
    c = client(node)
    # The scripted model answers a raw prompt that ends where an assistant turn begins.
    prompt = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    with trio.fail_after(TIMEOUT_S):
        whole = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=20)
        stream = await c.completions.create(
            model=MODEL, prompt=prompt, stream=True, stream_options={"include_usage": True}
        )
        pieces = [chunk async for chunk in stream]
    assert whole.object == "text_completion"
    assert whole.choices[0].text == SCRIPTED_PLAIN_ANSWER
    assert whole.choices[0].finish_reason == "stop"
    assert "".join(p.choices[0].text for p in pieces if p.choices) == SCRIPTED_PLAIN_ANSWER
    assert pieces[-1].usage is not None and whole.usage is not None
    assert pieces[-1].usage.completion_tokens == whole.usage.completion_tokens


async def test_bad_tool_requests_are_400s_and_the_node_keeps_serving(node: SharedNode) -> None:
    c = client(node)
    bad_tool = {"type": "function", "function": {"name": "no spaces allowed"}}
    with trio.fail_after(TIMEOUT_S):
        with pytest.raises(openai.BadRequestError) as refused:
            await c.chat.completions.create(model=MODEL, messages=ASK, tools=[bad_tool])
        assert refused.value.code == "invalid_value"
        with pytest.raises(openai.BadRequestError):
            await c.completions.create(model=MODEL, prompt=["a", "b"])
        ok = await c.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])
    assert ok.choices[0].finish_reason == "tool_calls"


async def test_a_json_schema_response_format_gives_matching_json(node: SharedNode) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    response_format: Any = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    with trio.fail_after(TIMEOUT_S):
        response = await client(node).chat.completions.create(
            model=MODEL, messages=ASK, response_format=response_format
        )
        with pytest.raises(openai.BadRequestError, match="schema"):
            bad: Any = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": 5}}}
            await client(node).chat.completions.create(
                model=MODEL, messages=ASK, response_format=bad
            )
    value = json.loads(response.choices[0].message.content or "")
    assert set(value) == {"ok"} and isinstance(value["ok"], bool)
