"""End to end with the official anthropic client, unchanged: tool use, streaming and token
counting against a real `trexo run` serving the scripted tool-calling demo model."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
import trio
from anthropic.types import Message, TextBlock, ToolUseBlock

from trexo.engine.scripted_model import (
    SCRIPTED_PLAIN_ANSWER,
    SCRIPTED_TOOL_ARGUMENTS,
    SCRIPTED_TOOL_NAME,
    SCRIPTED_TOOL_RESULT_ANSWER,
)

from .conftest import QUESTION, TOOLS_MODEL, WEATHER_DESCRIPTION, WEATHER_PARAMETERS
from .shared_node import SharedNode

MODEL = TOOLS_MODEL
TIMEOUT_S = 60.0
MAX_TOKENS = 64
ASK: list[Any] = [{"role": "user", "content": QUESTION}]
WEATHER: Any = {
    "name": SCRIPTED_TOOL_NAME,
    "description": WEATHER_DESCRIPTION,
    "input_schema": WEATHER_PARAMETERS,
}


@pytest.fixture
def node(tools_node: SharedNode) -> SharedNode:
    return tools_node


def client(node: SharedNode) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=node.url, api_key="unused", max_retries=0)


def the_call(message: Message) -> ToolUseBlock:
    (call,) = [block for block in message.content if isinstance(block, ToolUseBlock)]
    assert (call.name, call.input) == (SCRIPTED_TOOL_NAME, SCRIPTED_TOOL_ARGUMENTS)
    assert message.stop_reason == "tool_use"
    return call


def the_text(message: Message) -> str:
    (block,) = message.content
    assert isinstance(block, TextBlock)
    return block.text


async def test_a_tool_use_and_its_result_make_a_full_round_trip(node: SharedNode) -> None:
    c = client(node)
    with trio.fail_after(TIMEOUT_S):
        first = await c.messages.create(
            model=MODEL, max_tokens=MAX_TOKENS, messages=ASK, tools=[WEATHER]
        )
        call = the_call(first)
        result = {"type": "tool_result", "tool_use_id": call.id, "content": '{"sky": "clear"}'}
        conversation = [
            *ASK,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ]
        second = await c.messages.create(
            model=MODEL, max_tokens=MAX_TOKENS, messages=conversation, tools=[WEATHER]
        )
    assert first.id.startswith("msg_") and first.model == MODEL
    assert the_text(second) == SCRIPTED_TOOL_RESULT_ANSWER
    assert second.stop_reason == "end_turn"

    def prompt(usage: Any) -> int:
        return int(usage.input_tokens + (usage.cache_read_input_tokens or 0))

    assert prompt(second.usage) > prompt(first.usage)  # the call and its result


async def test_streams_with_and_without_a_tool(node: SharedNode) -> None:
    c = client(node)
    with trio.fail_after(TIMEOUT_S):
        async with c.messages.stream(model=MODEL, max_tokens=MAX_TOKENS, messages=ASK) as plain:
            texts = [text async for text in plain.text_stream]
            answer = await plain.get_final_message()
        async with c.messages.stream(
            model=MODEL, max_tokens=MAX_TOKENS, messages=ASK, tools=[WEATHER]
        ) as with_tool:
            called = await with_tool.get_final_message()
    assert len(texts) > 1  # the answer streamed in pieces
    assert "".join(texts) == SCRIPTED_PLAIN_ANSWER
    assert the_text(answer) == SCRIPTED_PLAIN_ANSWER
    assert answer.stop_reason == "end_turn"
    assert answer.usage.output_tokens > 0
    the_call(called)


async def test_a_stop_sequence_ends_the_turn_and_is_named(node: SharedNode) -> None:
    with trio.fail_after(TIMEOUT_S):
        reply = await client(node).messages.create(
            model=MODEL, max_tokens=MAX_TOKENS, messages=ASK, stop_sequences=["tools"]
        )
    cut = SCRIPTED_PLAIN_ANSWER[: SCRIPTED_PLAIN_ANSWER.index("tools")]
    assert (the_text(reply), reply.stop_reason, reply.stop_sequence) == (
        cut,
        "stop_sequence",
        "tools",
    )


async def test_a_last_assistant_turn_is_continued(node: SharedNode) -> None:
    begun = SCRIPTED_PLAIN_ANSWER[: SCRIPTED_PLAIN_ANSWER.index(" no")]
    messages = [*ASK, {"role": "assistant", "content": begun}]
    with trio.fail_after(TIMEOUT_S):
        reply = await client(node).messages.create(
            model=MODEL, max_tokens=MAX_TOKENS, messages=messages
        )
    assert begun + the_text(reply) == SCRIPTED_PLAIN_ANSWER


async def test_a_bad_request_is_a_400_and_the_node_keeps_serving(node: SharedNode) -> None:
    c = client(node)
    bad_tool = {**WEATHER, "name": "no spaces allowed"}
    with trio.fail_after(TIMEOUT_S):
        with pytest.raises(anthropic.BadRequestError) as refused:
            await c.messages.create(
                model=MODEL, max_tokens=MAX_TOKENS, messages=ASK, tools=[bad_tool]
            )
        counted = await c.messages.count_tokens(model=MODEL, messages=ASK)
        answer = await c.messages.create(model=MODEL, max_tokens=MAX_TOKENS, messages=ASK)
    assert refused.value.type == "invalid_request_error"
    assert "tools[0].name" in (refused.value.api_message or "")
    assert the_text(answer) == SCRIPTED_PLAIN_ANSWER
    usage = answer.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
