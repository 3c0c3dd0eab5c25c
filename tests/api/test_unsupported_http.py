"""Endpoints trexo does not serve answer 501 in their dialect's shape, saying what is missing
(not the 404 of a wrong URL), through the official clients too."""

from __future__ import annotations

import httpx
import ollama
import openai
import pytest
import trio

from trexo.api.unsupported import UNSUPPORTED

from .conftest import CLIENT_TIMEOUT_S

TEST_TIMEOUT_S = 20.0


@pytest.mark.parametrize("path", sorted(UNSUPPORTED))
async def test_each_unsupported_endpoint_says_so_in_its_dialects_shape(
    http: httpx.AsyncClient, path: str
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post(path, json={"model": "demo-tiny", "input": "hello"})
    assert response.status_code == 501, response.text
    body = response.json()
    if path.startswith("/api/"):  # Ollama's shape
        assert body == {"error": f"{UNSUPPORTED[path]} ({path})"}
    else:  # OpenAI's
        assert body["error"]["code"] == "unsupported_endpoint"
        assert UNSUPPORTED[path] in body["error"]["message"]


async def test_the_official_clients_read_what_is_missing(
    client: openai.AsyncOpenAI, api_url: str
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        with pytest.raises(openai.APIStatusError) as embeddings:
            await client.embeddings.create(model="demo-tiny", input="hello")
        async with ollama.AsyncClient(host=api_url, timeout=CLIENT_TIMEOUT_S) as local:
            with pytest.raises(ollama.ResponseError) as pull:
                await local.pull("demo-tiny")
    assert embeddings.value.status_code == 501
    assert "does not serve embeddings" in embeddings.value.message
    assert pull.value.status_code == 501
    assert "trexo download" in pull.value.error
