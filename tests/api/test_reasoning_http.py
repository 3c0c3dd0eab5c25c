"""A thinking model's reasoning, apart from its answer, in every dialect's own shape, read by
the official clients against a real server over the fake node: OpenAI Chat's
`reasoning_content`, Responses reasoning items, Anthropic thinking blocks, Ollama's
`thinking`; and each dialect's thinking switch reaching the request the node gets."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
import trio

from trexo.types.chunks import Usage
from trexo.types.generation import GenerationRequest

from .conftest import CLIENT_TIMEOUT_S
from .dialects import ndjson_lines
from .fake_node import DEMO, FakeNode, Step
from .sse import data_events, named_events

TEST_TIMEOUT_S = 30.0
MESSAGES: Any = [{"role": "user", "content": "hi"}]
REASONING = "Let me think."
ANSWER = "Hi!"
THINKING = (
    Step(reasoning="Let me"),
    Step(reasoning=" think."),
    Step(text="Hi"),
    Step(text="!", finish="stop", usage=Usage(5, 4, reasoning_tokens=2)),
)
"""Two chunks of reasoning, then two of answer: what a thinking model's runner sends."""
SIGNATURE = hashlib.sha256(REASONING.encode()).hexdigest()
ADAPTIVE: Any = {"type": "adaptive"}
"""Thinking as the model decides (`enabled` needs a budget beyond the fake model's context)."""


@pytest.fixture
def node() -> FakeNode:
    return FakeNode(THINKING)


def switches(node: FakeNode) -> Any:
    """The template variables of the one request the node got."""
    [(_, request)] = node.requests
    return _kwargs(request)


def _kwargs(request: GenerationRequest) -> Any:
    return None if request.template_kwargs is None else json.loads(request.template_kwargs)


# --- OpenAI Chat Completions ---------------------------------------------------------------------


async def test_chat_has_reasoning_content(client: openai.AsyncOpenAI, node: FakeNode) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        reply = await client.chat.completions.create(
            model=DEMO.model_id, messages=MESSAGES, reasoning_effort="high"
        )
    message = reply.choices[0].message
    assert message.content == ANSWER
    assert (message.model_extra or {})["reasoning_content"] == REASONING
    assert reply.usage is not None
    assert reply.usage.completion_tokens_details is not None
    assert reply.usage.completion_tokens_details.reasoning_tokens == 2
    assert switches(node) == {"reasoning_effort": "high"}


async def test_chat_streams_reasoning_deltas_first(
    client: openai.AsyncOpenAI, node: FakeNode
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        stream = await client.chat.completions.create(
            model=DEMO.model_id,
            messages=MESSAGES,
            stream=True,
            extra_body={"chat_template_kwargs": {"enable_thinking": True}},
        )
        deltas = [chunk.choices[0].delta async for chunk in stream if chunk.choices]
    said = [
        (field, value)
        for delta in deltas
        for field, value in (
            ("reasoning", (delta.model_extra or {}).get("reasoning_content")),
            ("answer", delta.content),
        )
        if value
    ]
    assert said == [
        ("reasoning", "Let me"),
        ("reasoning", " think."),
        ("answer", "Hi"),
        ("answer", "!"),
    ]
    assert switches(node) == {"enable_thinking": True}


# --- OpenAI Responses ----------------------------------------------------------------------------


async def test_responses_have_a_reasoning_item(client: openai.AsyncOpenAI, node: FakeNode) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await client.responses.create(
            model=DEMO.model_id, input="hi", reasoning={"effort": "low"}
        )
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and message.type == "message"
    assert reasoning.id.startswith("rs_") and reasoning.summary == []
    assert [(part.type, part.text) for part in reasoning.content or []] == [
        ("reasoning_text", REASONING)
    ]
    assert response.output_text == ANSWER
    assert response.usage is not None
    assert response.usage.output_tokens_details.reasoning_tokens == 2
    assert response.reasoning is not None and response.reasoning.effort == "low"
    assert switches(node) == {"reasoning_effort": "low"}


async def test_responses_stream_reasoning_text_events(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with client.responses.stream(model=DEMO.model_id, input="hi") as stream:
            events = [event async for event in stream]  # each validated by the client's types
            final = await stream.get_final_response()
        raw = (
            await http.post(
                "/v1/responses", json={"model": DEMO.model_id, "input": "hi", "stream": True}
            )
        ).text
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert deltas == ["Let me", " think."]
    [done] = [e for e in events if e.type == "response.reasoning_text.done"]
    assert (done.text, done.output_index, done.content_index) == (REASONING, 0, 0)
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == ANSWER
    kinds = [event["type"] for event in named_events(raw)]
    assert kinds[2:8] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
    ]
    assert kinds[8:10] == ["response.output_item.done", "response.output_item.added"]


# --- Anthropic Messages --------------------------------------------------------------------------


@pytest.fixture
async def claude(api_url: str) -> Any:
    async with anthropic.AsyncAnthropic(
        base_url=api_url, api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT_S
    ) as client:
        yield client


async def test_anthropic_has_thinking_blocks(
    claude: anthropic.AsyncAnthropic, node: FakeNode
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        reply = await claude.messages.create(
            model=DEMO.model_id, max_tokens=16, messages=MESSAGES, thinking=ADAPTIVE
        )
    thinking, text = reply.content
    assert thinking.type == "thinking" and text.type == "text"
    assert (thinking.thinking, thinking.signature) == (REASONING, SIGNATURE)
    assert text.text == ANSWER
    assert reply.stop_reason == "end_turn"
    assert switches(node) is None  # adaptive: the template's default


async def test_anthropic_streams_thinking_then_its_signature(
    claude: anthropic.AsyncAnthropic, http: httpx.AsyncClient
) -> None:
    body = {"model": DEMO.model_id, "max_tokens": 16, "messages": MESSAGES, "thinking": ADAPTIVE}
    with trio.fail_after(TEST_TIMEOUT_S):
        async with claude.messages.stream(**body) as stream:
            events = [event async for event in stream]
            final = await stream.get_final_message()
        raw = (await http.post("/v1/messages", json={**body, "stream": True})).text
    assert [(b.type, getattr(b, "thinking", None)) for b in final.content] == [
        ("thinking", REASONING),
        ("text", None),
    ]
    assert final.content[1].type == "text" and final.content[1].text == ANSWER
    thinking = [e.thinking for e in events if e.type == "thinking"]
    assert thinking == ["Let me", " think."]
    deltas = [
        (e["index"], e["delta"]["type"]) for e in named_events(raw) if "delta" in e and "index" in e
    ]
    assert deltas == [
        (0, "thinking_delta"),
        (0, "thinking_delta"),
        (0, "signature_delta"),
        (1, "text_delta"),
        (1, "text_delta"),
    ]


async def test_anthropic_omitted_thinking_is_an_empty_signed_block(
    claude: anthropic.AsyncAnthropic, http: httpx.AsyncClient
) -> None:
    omitted = {**ADAPTIVE, "display": "omitted"}
    body = {"model": DEMO.model_id, "max_tokens": 16, "messages": MESSAGES, "thinking": omitted}
    with trio.fail_after(TEST_TIMEOUT_S):
        reply = await claude.messages.create(**body)
        raw = (await http.post("/v1/messages", json={**body, "stream": True})).text
    thinking = reply.content[0]
    assert thinking.type == "thinking"
    assert (thinking.thinking, thinking.signature) == ("", SIGNATURE)
    kinds = [e["delta"]["type"] for e in named_events(raw) if e["type"] == "content_block_delta"]
    assert "thinking_delta" not in kinds and "signature_delta" in kinds


# --- Ollama --------------------------------------------------------------------------------------


@pytest.fixture
async def ollama_client(api_url: str) -> Any:
    async with ollama.AsyncClient(host=api_url, timeout=CLIENT_TIMEOUT_S) as client:
        yield client


async def test_ollama_has_thinking(ollama_client: ollama.AsyncClient, node: FakeNode) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        chat = await ollama_client.chat(model=DEMO.model_id, messages=MESSAGES, think=True)
        parts = [
            part
            async for part in await ollama_client.chat(
                model=DEMO.model_id, messages=MESSAGES, think=False, stream=True
            )
        ]
        generated = await ollama_client.generate(model=DEMO.model_id, prompt="hi")
    assert (chat.message.thinking, chat.message.content) == (REASONING, ANSWER)
    assert "".join(p.message.thinking or "" for p in parts) == REASONING
    assert "".join(p.message.content or "" for p in parts) == ANSWER
    assert (generated.thinking, generated.response) == (REASONING, ANSWER)
    assert [_kwargs(request) for _, request in node.requests] == [
        {"enable_thinking": True},
        {"enable_thinking": False},
        None,  # no `think`: the template's default
    ]


async def test_ollama_lines_of_reasoning_have_an_empty_answer(http: httpx.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post("/api/chat", json={"model": DEMO.model_id, "messages": MESSAGES})
    messages = [line["message"] for line in ndjson_lines(response.text)]
    assert messages[:3] == [
        {"role": "assistant", "content": "", "thinking": "Let me"},
        {"role": "assistant", "content": "", "thinking": " think."},
        {"role": "assistant", "content": "Hi"},
    ]


# --- raw bodies ----------------------------------------------------------------------------------


async def test_chat_leaves_reasoning_out_when_there_is_none(
    http: httpx.AsyncClient, node: FakeNode
) -> None:
    node.script = (Step(text=ANSWER, finish="stop", usage=Usage(5, 1)),)
    body = {"model": DEMO.model_id, "messages": MESSAGES}
    with trio.fail_after(TEST_TIMEOUT_S):
        whole = (await http.post("/v1/chat/completions", json=body)).json()
        raw = (await http.post("/v1/chat/completions", json={**body, "stream": True})).text
    assert "reasoning_content" not in whole["choices"][0]["message"]
    assert not any(
        "reasoning_content" in event["choices"][0]["delta"]
        for event in data_events(raw)
        if isinstance(event, dict) and event["choices"]
    )
