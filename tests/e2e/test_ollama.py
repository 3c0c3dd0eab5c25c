"""End to end with the official `ollama` client, unchanged: chat (with a tool round trip and
streamed), generate, the model endpoints and a bad request, against a real `trexo run`
serving the scripted tool-calling demo model, on its API port and on the second listener
that `--ollama-port` opens."""

from __future__ import annotations

import re

import httpx
import ollama
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
OLLAMA_LINE = re.compile(r"Ollama API also on (http://\S+)")
ASK = [{"role": "user", "content": QUESTION}]
WEATHER = OPENAI_WEATHER


@pytest.fixture
def node(tools_node: SharedNode) -> SharedNode:
    return tools_node


def ollama_url(node: SharedNode) -> str:
    """The second listener's URL, as the startup output reports it."""
    stdout = (node.data_dir / "stdout.log").read_text()
    match = OLLAMA_LINE.search(stdout)
    assert match is not None, stdout
    return match.group(1)


async def test_a_tool_call_and_its_result_make_a_full_round_trip(node: SharedNode) -> None:
    client = ollama.AsyncClient(host=node.url)
    with trio.fail_after(TIMEOUT_S):
        first = await client.chat(model=MODEL, messages=ASK, tools=[WEATHER])
        [call] = first.message.tool_calls or []
        assert (call.function.name, dict(call.function.arguments)) == (
            SCRIPTED_TOOL_NAME,
            SCRIPTED_TOOL_ARGUMENTS,
        )
        assert first.done_reason == "stop"
        result = {"role": "tool", "content": "sunny, 24 C", "tool_name": SCRIPTED_TOOL_NAME}
        second = await client.chat(
            model=MODEL, messages=[*ASK, first.message, result], tools=[WEATHER]
        )
    assert second.message.content == SCRIPTED_TOOL_RESULT_ANSWER
    assert not second.message.tool_calls
    assert second.prompt_eval_count is not None
    assert first.prompt_eval_count is not None
    assert second.prompt_eval_count > first.prompt_eval_count  # the call and result were sent


async def test_chat_streamed(node: SharedNode) -> None:
    client = ollama.AsyncClient(host=node.url)
    with trio.fail_after(TIMEOUT_S):
        parts = [part async for part in await client.chat(model=MODEL, messages=ASK, stream=True)]
    *deltas, done = parts
    assert len(deltas) > 1  # it streamed
    assert "".join(part.message.content or "" for part in deltas) == SCRIPTED_PLAIN_ANSWER
    assert (done.done, done.done_reason) == (True, "stop")
    assert done.eval_count is not None
    assert done.eval_count >= len(deltas)


async def test_generate_streamed_and_not(node: SharedNode) -> None:
    client = ollama.AsyncClient(host=node.url)
    with trio.fail_after(TIMEOUT_S):
        whole = await client.generate(model=MODEL, prompt="Hello")
        parts = [
            part async for part in await client.generate(model=MODEL, prompt="Hi", stream=True)
        ]
    assert whole.response == SCRIPTED_PLAIN_ANSWER
    assert "".join(part.response or "" for part in parts) == SCRIPTED_PLAIN_ANSWER
    assert parts[-1].done


async def test_list_show_and_ps(node: SharedNode) -> None:
    client = ollama.AsyncClient(host=node.url)
    with trio.fail_after(TIMEOUT_S):
        listed = await client.list()
        shown = await client.show(MODEL)
        running = await client.ps()
    assert MODEL in {model.model for model in listed.models}
    assert shown.modelinfo is not None
    assert shown.modelinfo["trexo.ready"] is True
    assert [model.model for model in running.models] == [MODEL]


async def test_a_bad_request_is_a_400_and_the_node_keeps_serving(node: SharedNode) -> None:
    client = ollama.AsyncClient(host=node.url)
    with trio.fail_after(TIMEOUT_S):
        with pytest.raises(ollama.ResponseError) as caught:
            await client.chat(model=MODEL, messages=ASK, options={"top_p": 1.5})
        assert caught.value.status_code == 400
        assert "top_p" in caught.value.error
        answer = await client.chat(model=MODEL, messages=ASK)
        # Options trexo's sampler lacks are ignored, as Ollama ignores what it does not use.
        ignored = await client.chat(
            model=MODEL, messages=ASK, options={"mirostat": 2, "typical_p": 0.7}
        )
    assert answer.message.content == SCRIPTED_PLAIN_ANSWER
    assert ignored.message.content == SCRIPTED_PLAIN_ANSWER


async def test_the_second_listener_serves_ollama_clients(node: SharedNode) -> None:
    url = ollama_url(node)
    assert url != node.url
    client = ollama.AsyncClient(host=url)
    with trio.fail_after(TIMEOUT_S):
        answer = await client.chat(model=f"{MODEL}:latest", messages=ASK)
        async with httpx.AsyncClient() as http:
            root = await http.get(f"{url}/")
    assert answer.message.content == SCRIPTED_PLAIN_ANSWER
    assert answer.model == f"{MODEL}:latest"
    assert (root.status_code, root.text) == (200, "Ollama is running")
