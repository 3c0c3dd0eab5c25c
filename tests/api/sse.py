"""Reading a raw SSE response the way a strict client would."""

from __future__ import annotations

import json
from typing import Any


def split_events(raw: str) -> list[str]:
    """The events of a complete SSE body; every event must end with a blank line."""
    assert raw.endswith("\n\n"), f"body does not end with a blank line: {raw[-40:]!r}"
    return raw[:-2].split("\n\n")


def data_events(raw: str) -> list[Any]:
    """OpenAI's `data:` payloads, JSON-decoded, up to and including the final "[DONE]"."""
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


def named_events(raw: str) -> list[dict[str, Any]]:
    """Named events (Anthropic's, OpenAI Responses'): each is named by its data's `type`."""
    out = []
    for event in split_events(raw):
        if event.startswith(":"):
            continue  # a comment (keep-alive)
        name, data = event.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), event
        body = json.loads(data.removeprefix("data: "))
        assert body["type"] == name.removeprefix("event: "), event
        out.append(body)
    return out
