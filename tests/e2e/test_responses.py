"""End to end: the OpenAI Responses API of a real `trexo run`, with the official client,
unchanged, against the scripted tool-calling demo model."""

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

from .conftest import QUESTION, TOOLS_MODEL, WEATHER_DESCRIPTION, WEATHER_PARAMETERS
from .shared_node import SharedNode

MODEL = TOOLS_MODEL
TIMEOUT_S = 60.0
WEATHER: Any = {
    "type": "function",
    "name": SCRIPTED_TOOL_NAME,
    "description": WEATHER_DESCRIPTION,
    "parameters": WEATHER_PARAMETERS,
}


@pytest.fixture
def node(tools_node: SharedNode) -> SharedNode:
    return tools_node


def client(node: SharedNode) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0)


async def test_a_tool_call_and_its_round_trip(node: SharedNode) -> None:
    async with client(node) as c:
        with trio.fail_after(TIMEOUT_S):
            asked = await c.responses.create(model=MODEL, input=QUESTION, tools=[WEATHER])
            assert asked.status == "completed"
            [call] = [item for item in asked.output if item.type == "function_call"]
            assert call.name == SCRIPTED_TOOL_NAME
            assert json.loads(call.arguments) == SCRIPTED_TOOL_ARGUMENTS
            answered = await c.responses.create(
                model=MODEL,
                tools=[WEATHER],
                input=[
                    {"role": "user", "content": QUESTION},
                    # the output replayed as input, as OpenAI's guide does
                    *asked.output,  # type: ignore[list-item]
                    {
                        "type": "function_call_output",
                        "call_id": call.call_id,
                        "output": json.dumps({"sky": "sunny"}),
                    },
                ],
            )
    assert answered.status == "completed"
    assert answered.output_text == SCRIPTED_TOOL_RESULT_ANSWER
    assert answered.usage is not None
    assert answered.usage.input_tokens > asked.usage.input_tokens > 0  # type: ignore[union-attr]


async def test_streaming_with_instructions(node: SharedNode) -> None:
    async with client(node) as c:
        with trio.fail_after(TIMEOUT_S):
            async with c.responses.stream(
                model=MODEL, input="Hello there.", instructions="Answer briefly."
            ) as stream:
                deltas = [
                    event.delta
                    async for event in stream
                    if event.type == "response.output_text.delta"
                ]
                final = await stream.get_final_response()
    assert "".join(deltas) == SCRIPTED_PLAIN_ANSWER
    assert len(deltas) > 1  # streamed in pieces, not at the end
    assert final.output_text == SCRIPTED_PLAIN_ANSWER
    assert final.instructions == "Answer briefly."
    assert final.usage is not None and final.usage.output_tokens > 0


async def test_a_streamed_tool_call(node: SharedNode) -> None:
    async with client(node) as c:
        with trio.fail_after(TIMEOUT_S):
            stream = await c.responses.create(
                model=MODEL, input=QUESTION, tools=[WEATHER], stream=True
            )
            events = [event async for event in stream]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(e.arguments) for e in done] == [SCRIPTED_TOOL_ARGUMENTS]
    last = events[-1]
    assert last.type == "response.completed"
    calls = [item for item in last.response.output if item.type == "function_call"]
    assert [call.name for call in calls] == [SCRIPTED_TOOL_NAME]


async def test_a_bad_request_then_the_node_still_answers(node: SharedNode) -> None:
    async with client(node) as c:
        with trio.fail_after(TIMEOUT_S):
            with pytest.raises(openai.BadRequestError) as caught:
                await c.responses.create(
                    model=MODEL,
                    input=QUESTION,
                    tools=[{"type": "web_search"}],
                )
            assert caught.value.status_code == 400
            assert caught.value.param == "tools[0].type"
            response = await c.responses.create(model=MODEL, input="Hello there.")
    assert response.output_text == SCRIPTED_PLAIN_ANSWER
