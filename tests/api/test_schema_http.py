"""A JSON schema the node cannot use is a 400 naming where the dialect carries it.

The schema is checked when the request is admitted (bounded, off the event loop, by the
node: `trexo.schema_guard`; here the fake node checks it in this process), before anything
reaches the cluster.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from .fake_node import DEMO, FakeNode

NONSENSE = {"type": "nonsense"}
MESSAGES = [{"role": "user", "content": "hi"}]


def chat(schema: Any) -> dict[str, Any]:
    spec = {"name": "x", "schema": schema}
    return {
        "model": DEMO.model_id,
        "messages": MESSAGES,
        "response_format": {"type": "json_schema", "json_schema": spec},
    }


def responses(schema: Any) -> dict[str, Any]:
    spec = {"type": "json_schema", "name": "x", "schema": schema}
    return {"model": DEMO.model_id, "input": "hi", "text": {"format": spec}}


def anthropic(schema: Any) -> dict[str, Any]:
    spec = {"type": "json_schema", "schema": schema}
    return {
        "model": DEMO.model_id,
        "max_tokens": 8,
        "messages": MESSAGES,
        "output_config": {"format": spec},
    }


def ollama(schema: Any) -> dict[str, Any]:
    return {"model": DEMO.model_id, "messages": MESSAGES, "format": schema, "stream": False}


DIALECTS = [
    pytest.param("/v1/chat/completions", chat, "response_format.json_schema.schema", id="chat"),
    pytest.param("/v1/responses", responses, "text.format.schema", id="responses"),
    pytest.param("/v1/messages", anthropic, "output_config.format.schema", id="anthropic"),
    pytest.param("/api/chat", ollama, "format", id="ollama"),
]


@pytest.mark.parametrize(("path", "body", "param"), DIALECTS)
async def test_an_unusable_schema_is_a_400_naming_its_field(
    http: httpx.AsyncClient, node: FakeNode, path: str, body: Any, param: str
) -> None:
    refused = await http.post(path, json=body(NONSENSE))
    assert refused.status_code == 400, refused.text
    assert "Invalid type: nonsense" in refused.text
    assert param in refused.text
    assert node.requests == []  # nothing reached the cluster
    served = await http.post(path, json=body({"type": "object"}))
    assert served.status_code == 200, served.text
