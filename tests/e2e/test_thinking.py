"""End to end with the official clients, unchanged: a real `trexo run` serving the scripted
thinking demo model (`trexo.engine.thinking_model`) returns its reasoning apart from its
answer in every dialect (OpenAI's `reasoning_content`, Responses reasoning items, Anthropic
thinking blocks, Ollama's `thinking`), and each dialect's switch turns thinking off."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import ollama
import openai
import pytest
import trio

from trexo.engine.thinking_model import SCRIPTED_ANSWER, SCRIPTED_REASONING

from .shared_node import SharedNode, shared_node

MODEL = "trexo-demo-thinking"
TIMEOUT_S = 60.0
ASK: Any = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedNode]:
    data_dir = tmp_path_factory.mktemp("thinking-node")
    with shared_node(data_dir, MODEL, "--demo-size", "thinking") as node:
        yield node


def openai_client(node: SharedNode) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0)


async def test_openai_chat_has_reasoning_content(node: SharedNode) -> None:
    client = openai_client(node)
    with trio.fail_after(TIMEOUT_S):
        thought = await client.chat.completions.create(model=MODEL, messages=ASK)
        stream = await client.chat.completions.create(model=MODEL, messages=ASK, stream=True)
        deltas = [chunk.choices[0].delta async for chunk in stream if chunk.choices]
        direct = await client.chat.completions.create(
            model=MODEL, messages=ASK, reasoning_effort="none"
        )
    message = thought.choices[0].message
    assert (message.model_extra or {})["reasoning_content"] == SCRIPTED_REASONING
    assert message.content == SCRIPTED_ANSWER
    assert thought.usage is not None and thought.usage.completion_tokens_details is not None
    assert thought.usage.completion_tokens_details.reasoning_tokens == 5
    streamed = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert (streamed, "".join(d.content or "" for d in deltas)) == (
        SCRIPTED_REASONING,
        SCRIPTED_ANSWER,
    )
    assert "reasoning_content" not in (direct.choices[0].message.model_extra or {})
    assert direct.choices[0].message.content == SCRIPTED_ANSWER


async def test_openai_responses_have_a_reasoning_item(node: SharedNode) -> None:
    client = openai_client(node)
    with trio.fail_after(TIMEOUT_S):
        response = await client.responses.create(model=MODEL, input="Hi")
    reasoning, _ = response.output
    assert reasoning.type == "reasoning"
    assert [part.text for part in reasoning.content or []] == [SCRIPTED_REASONING]
    assert response.output_text == SCRIPTED_ANSWER


async def test_anthropic_has_thinking_blocks_when_thinking_is_enabled(node: SharedNode) -> None:
    client = anthropic.AsyncAnthropic(base_url=node.url, api_key="unused", max_retries=0)
    enabled: Any = {"type": "enabled", "budget_tokens": 1024}
    with trio.fail_after(TIMEOUT_S):
        thought = await client.messages.create(
            model=MODEL, max_tokens=2048, messages=ASK, thinking=enabled
        )
        async with client.messages.stream(
            model=MODEL, max_tokens=2048, messages=ASK, thinking=enabled
        ) as stream:
            streamed = await stream.get_final_message()
        plain = await client.messages.create(model=MODEL, max_tokens=64, messages=ASK)
    for message in (thought, streamed):
        thinking, text = message.content
        assert thinking.type == "thinking" and thinking.thinking == SCRIPTED_REASONING
        assert thinking.signature
        assert text.type == "text" and text.text == SCRIPTED_ANSWER
    # Without `thinking`, as on Anthropic's API, the model is told not to think.
    assert [(block.type, getattr(block, "text", None)) for block in plain.content] == [
        ("text", SCRIPTED_ANSWER)
    ]


async def test_ollama_has_thinking(node: SharedNode) -> None:
    client = ollama.AsyncClient(host=node.url)
    with trio.fail_after(TIMEOUT_S):
        chat = await client.chat(model=MODEL, messages=ASK, think=True)
        generated = await client.generate(model=MODEL, prompt="Hi")
        parts = [part async for part in await client.chat(model=MODEL, messages=ASK, stream=True)]
        direct = await client.chat(model=MODEL, messages=ASK, think=False)
    assert (chat.message.thinking, chat.message.content) == (SCRIPTED_REASONING, SCRIPTED_ANSWER)
    assert (generated.thinking, generated.response) == (SCRIPTED_REASONING, SCRIPTED_ANSWER)
    assert "".join(p.message.thinking or "" for p in parts) == SCRIPTED_REASONING
    assert "".join(p.message.content or "" for p in parts) == SCRIPTED_ANSWER
    assert (direct.message.thinking, direct.message.content) == (None, SCRIPTED_ANSWER)
