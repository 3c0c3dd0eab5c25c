"""The generation dialects as data, for tests that prove one behaviour of them all: where each
is served, how to ask it for an answer, and how to read its stream the way a strict client
would. What differs between dialects is written here, once, and not as branches in tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
import httpx

from .fake_node import DEMO
from .sse import data_events, named_events

SSE = "text/event-stream; charset=utf-8"
NDJSON = "application/x-ndjson"
KEEPALIVE = ": keep-alive\n\n"
"""The SSE comment a stream is kept alive with."""
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]

Events = list[Any]


@attrs.frozen
class Dialect:
    name: str
    """The test id."""
    path: str
    body: Callable[[bool], dict[str, Any]]
    """A request for DEMO's answer to "hi": `body(stream)`."""
    content_type: str
    """A streamed answer's."""
    events: Callable[[str], Events]
    """A whole streamed body's events, read strictly: anything else in it fails."""
    text: Callable[[Events], str]
    """The answer's text, as the stream tells it."""
    ending: Callable[[Events], object]
    """What the stream's last events say about how it ended."""
    ended_by_length: object
    """`ending` of a generation that finished with "length"."""
    ended_by_cancel: object
    """`ending` of a generation cancelled by `POST /v1/cancel/{id}`: a shorter answer."""
    id_prefix: str
    streamed_id: Callable[[Events], str] | None
    """The request id as the stream names it (what `/v1/cancel/{id}` takes); None where the
    stream names none."""
    keeps_alive: bool
    """Long silences carry `KEEPALIVE`; NDJSON has no line a client would ignore."""

    async def read_stream(self, http: httpx.AsyncClient, body: dict[str, Any]) -> tuple[int, str]:
        return await read_stream(http, self.path, body, self.content_type)


async def read_stream(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], content_type: str
) -> tuple[int, str]:
    """POST `body` to `path`; the status and the whole body, which must be `content_type`."""
    async with http.stream("POST", path, json=body) as response:
        raw = (await response.aread()).decode()
    assert response.headers["content-type"] == content_type, (response.status_code, raw[:200])
    return response.status_code, raw


def ndjson_lines(raw: str) -> Events:
    """The lines of a complete NDJSON body; every one must be JSON and end with a newline."""
    assert raw.endswith("\n"), raw[-40:]
    return [json.loads(line) for line in raw[:-1].split("\n")]


def responses_events(raw: str) -> Events:
    """The Responses API's named events, numbered in order from 0."""
    events = named_events(raw)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


OPENAI_CHAT = Dialect(
    name="openai-chat",
    path="/v1/chat/completions",
    body=lambda stream: {"model": DEMO.model_id, "messages": MESSAGES, "stream": stream},
    content_type=SSE,
    events=data_events,
    text=lambda events: "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"]
    ),
    ending=lambda events: events[-2]["choices"][0]["finish_reason"],
    ended_by_length="length",
    ended_by_cancel="stop",
    id_prefix="chatcmpl-",
    streamed_id=lambda events: events[0]["id"],
    keeps_alive=True,
)
OPENAI_COMPLETIONS = Dialect(
    name="openai-completions",
    path="/v1/completions",
    body=lambda stream: {"model": DEMO.model_id, "prompt": "hi", "stream": stream},
    content_type=SSE,
    events=data_events,
    text=lambda events: "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"]),
    ending=lambda events: events[-2]["choices"][0]["finish_reason"],
    ended_by_length="length",
    ended_by_cancel="stop",
    id_prefix="cmpl-",
    streamed_id=lambda events: events[0]["id"],
    keeps_alive=True,
)
OPENAI_RESPONSES = Dialect(
    name="openai-responses",
    path="/v1/responses",
    body=lambda stream: {"model": DEMO.model_id, "input": "hi", "stream": stream},
    content_type=SSE,
    events=responses_events,
    # The text of the response the last event carries, the one a client keeps.
    text=lambda events: events[-1]["response"]["output"][0]["content"][0]["text"],
    ending=lambda events: (events[-1]["type"], events[-1]["response"]["status"]),
    ended_by_length=("response.incomplete", "incomplete"),
    ended_by_cancel=("response.completed", "completed"),
    id_prefix="resp_",
    streamed_id=lambda events: events[0]["response"]["id"],
    keeps_alive=True,
)
ANTHROPIC = Dialect(
    name="anthropic",
    path="/v1/messages",
    body=lambda stream: {
        "model": DEMO.model_id,
        "max_tokens": 16,
        "messages": MESSAGES,
        "stream": stream,
    },
    content_type=SSE,
    events=named_events,
    text=lambda events: "".join(
        e["delta"]["text"] for e in events if e["type"] == "content_block_delta"
    ),
    ending=lambda events: (events[-2]["delta"]["stop_reason"], events[-1]),
    ended_by_length=("max_tokens", {"type": "message_stop"}),
    ended_by_cancel=("end_turn", {"type": "message_stop"}),
    id_prefix="msg_",
    streamed_id=lambda events: events[0]["message"]["id"],
    keeps_alive=True,
)
OLLAMA = Dialect(
    name="ollama",
    path="/api/chat",
    body=lambda stream: {"model": DEMO.model_id, "messages": MESSAGES, "stream": stream},
    content_type=NDJSON,
    events=ndjson_lines,
    text=lambda lines: "".join(line["message"]["content"] for line in lines),
    ending=lambda lines: (lines[-1]["done"], lines[-1]["done_reason"]),
    ended_by_length=(True, "length"),
    ended_by_cancel=(True, "stop"),
    id_prefix="ollama-",
    streamed_id=None,  # Ollama's lines carry no id
    keeps_alive=False,
)
DIALECTS = (OPENAI_CHAT, OPENAI_COMPLETIONS, OPENAI_RESPONSES, ANTHROPIC, OLLAMA)
