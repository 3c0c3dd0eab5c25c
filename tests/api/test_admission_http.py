"""Admission over real HTTP: a prompt must leave room in the context, checked before the node
is asked to generate, and max_tokens is capped to that room; hostile text is a 400."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from .fake_node import DEMO, FAKE_CONTEXT, FakeNode

TIMEOUT_S = 20.0


def chat(words: int, **extra: Any) -> dict[str, Any]:
    content = " ".join(["word"] * words)
    return {"model": DEMO.model_id, "messages": [{"role": "user", "content": content}], **extra}


async def post(http: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    with trio.fail_after(TIMEOUT_S):
        return await http.post("/v1/chat/completions", json=body)


async def test_a_prompt_that_fills_the_context_is_refused_before_it_reaches_the_node(
    http: httpx.AsyncClient, node: FakeNode
) -> None:
    response = await post(http, chat(FAKE_CONTEXT))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
    assert f"{FAKE_CONTEXT} tokens" in error["message"]
    assert node.requests == []


async def test_max_tokens_beyond_the_room_left_is_capped_to_it(
    http: httpx.AsyncClient, node: FakeNode
) -> None:
    # Clients size their limit for large models (ChatAnthropic sends 4096, litellm 128000):
    # what fits is generated, as mlx_lm.server, llama.cpp and Ollama do.
    response = await post(http, chat(60, max_tokens=128_000))
    assert response.status_code == 200, response.text
    assert node.requests[-1][1].params.max_tokens == FAKE_CONTEXT - 60
    fits = await post(http, chat(60, max_tokens=40))
    assert fits.status_code == 200, fits.text
    assert node.requests[-1][1].params.max_tokens == 40


async def test_an_absent_max_tokens_becomes_what_fits(
    http: httpx.AsyncClient, node: FakeNode
) -> None:
    response = await post(http, chat(30))
    assert response.status_code == 200, response.text
    assert node.requests[-1][1].params.max_tokens == FAKE_CONTEXT - 30


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("digits", [13, 400])
async def test_an_absurd_max_tokens_is_a_400(
    http: httpx.AsyncClient, node: FakeNode, field: str, digits: int
) -> None:
    raw = httpx.Request("POST", "/", json=chat(1)).content  # then splice a huge number in
    raw = raw[:-1] + f', "{field}": 1{"0" * (digits - 1)}}}'.encode()
    with trio.fail_after(TIMEOUT_S):
        response = await http.post(
            "/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    # Past a JSON number's sane size the body itself is refused; below it, the field.
    assert error["param"] == field or error["code"] == "invalid_json", error
    assert node.requests == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(0) | {"messages": [{"role": "user", "content": "a\ud800b"}]}, "messages[0].content"),
        (
            chat(0)
            | {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
            "messages[0].content[0].text",
        ),
        (chat(2, stop=["ok", "\ud83d"]), "stop[1]"),
    ],
)
async def test_a_lone_surrogate_is_a_400_that_names_where(
    http: httpx.AsyncClient, node: FakeNode, body: dict[str, Any], param: str
) -> None:
    # Valid JSON (json.dumps escapes it as \ud800), but not Unicode text.
    with trio.fail_after(TIMEOUT_S):
        response = await http.post(
            "/v1/chat/completions",
            content=json.dumps(body),
            headers={"Content-Type": "application/json"},
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert "lone surrogate" in error["message"]
    assert node.requests == []
