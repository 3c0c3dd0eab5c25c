"""Reading a raw SSE response the way a strict client would."""

from __future__ import annotations

import json
from typing import Any

import httpx


def split_events(raw: str) -> list[str]:
    """The events of a complete SSE body; every event must end with a blank line."""
    assert raw.endswith("\n\n"), f"body does not end with a blank line: {raw[-40:]!r}"
    return raw[:-2].split("\n\n")


def data_events(raw: str) -> list[Any]:
    """The `data:` payloads, JSON-decoded, up to and including the final "[DONE]"."""
    out: list[Any] = []
    for event in split_events(raw):
        if event.startswith(":"):
            continue  # a comment (keep-alive)
        assert event.startswith("data: "), event
        payload = event.removeprefix("data: ")
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    assert out, raw
    assert out[-1] == "[DONE]", out[-3:]
    assert "[DONE]" not in out[:-1]
    return out


async def read_stream(http: httpx.AsyncClient, body: dict[str, Any]) -> tuple[int, str]:
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        raw = (await response.aread()).decode()
        assert response.headers["content-type"].startswith("text/event-stream")
        return response.status_code, raw
