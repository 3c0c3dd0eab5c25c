"""Building OpenAI response objects and SSE events from trexo chunks."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trexo.api.chat_response import (
    ChunkEncoder,
    completion_body,
    completion_from_chunks,
    openai_finish_reason,
)
from trexo.api.outcome import Outcome, usage_of
from trexo.api.sse import DONE, KEEPALIVE, sse_event
from trexo.types.chunks import Chunk, Usage
from trexo.types.ids import RequestId

RID = RequestId("chatcmpl-1")
CREATED = 1_700_000_000


def chunk(text: str, finish: Any = None, usage: Usage | None = None, tokens: int = 1) -> Chunk:
    return Chunk(RID, text, tuple(range(tokens)), finish_reason=finish, usage=usage)


def test_finish_reasons() -> None:
    assert openai_finish_reason("stop") == "stop"
    assert openai_finish_reason("length") == "length"
    assert openai_finish_reason("cancelled") == "stop"
    assert openai_finish_reason("tool_calls") == "tool_calls"
    with pytest.raises(ValueError, match="error"):
        openai_finish_reason("error")


def test_completion_body_is_openais_shape() -> None:
    body = completion_body(
        Outcome("hi", "length", Usage(3, 2)), request_id=RID, model="m", created=CREATED
    )
    assert body == {
        "id": RID,
        "object": "chat.completion",
        "created": CREATED,
        "model": "m",
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi", "refusal": None},
                "logprobs": None,
                "finish_reason": "length",
            }
        ],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": 2,
            "total_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0},
        },
    }


def test_completion_from_chunks_joins_text_and_takes_the_last_usage() -> None:
    chunks = [chunk("a"), chunk(""), chunk("b", "stop", Usage(4, 2))]
    body = completion_from_chunks(chunks, request_id=RID, model="m", created=CREATED)
    assert body["choices"][0]["message"]["content"] == "ab"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["total_tokens"] == 6


def test_prompt_tokens_from_the_cache_are_reported_as_openai_does() -> None:
    usage = Usage(prompt_tokens=900, completion_tokens=5, cached_tokens=850)
    body = completion_from_chunks(
        [chunk("a", "stop", usage)], request_id=RID, model="m", created=CREATED
    )
    assert body["usage"]["prompt_tokens"] == 900
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 850}


def test_completion_needs_a_finished_generation() -> None:
    with pytest.raises(ValueError, match="finished"):
        completion_from_chunks([chunk("a")], request_id=RID, model="m", created=CREATED)
    with pytest.raises(ValueError, match="finished"):
        completion_from_chunks([], request_id=RID, model="m", created=CREATED)


def test_usage_is_counted_when_not_reported() -> None:
    assert usage_of([chunk("a", tokens=2), chunk("b", "stop", tokens=3)]) == Usage(0, 5)


def encoder(include_usage: bool = False) -> ChunkEncoder:
    return ChunkEncoder(request_id=RID, model="m", created=CREATED, include_usage=include_usage)


def test_stream_without_usage() -> None:
    enc = encoder()
    events = [*enc.opening()]
    for c in [chunk("He"), chunk(""), chunk("llo", "cancelled", Usage(1, 2))]:
        events += enc.encode(c)
    assert enc.finished
    assert enc.encode(chunk("late")) == []
    for event in events:
        assert event["id"] == RID
        assert event["object"] == "chat.completion.chunk"
        assert (event["created"], event["model"]) == (CREATED, "m")
        assert "usage" not in event
    assert [e["choices"] for e in events] == [
        [choice({"role": "assistant", "content": ""})],
        [choice({"content": "He"})],
        [choice({"content": "llo"})],
        [choice({}, "stop")],
    ]


def test_stream_with_usage_ends_with_a_choiceless_usage_chunk() -> None:
    enc = encoder(include_usage=True)
    events = [*enc.opening(), *enc.encode(chunk("x", "length", Usage(7, 1)))]
    assert [e["usage"] for e in events[:-1]] == [None, None, None]
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 1,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    assert events[-2]["choices"] == [choice({}, "length")]


def test_stream_usage_is_counted_when_not_reported() -> None:
    enc = encoder(include_usage=True)
    enc.encode(chunk("a", tokens=2))
    *_, last = enc.encode(chunk("b", "stop", tokens=2))
    assert last["usage"]["completion_tokens"] == 4


@given(st.lists(st.text(max_size=5), max_size=8), st.sampled_from(["stop", "length", "cancelled"]))
def test_stream_deltas_add_up_to_the_text(texts: list[str], finish: Any) -> None:
    enc = encoder(include_usage=True)
    chunks = [chunk(t) for t in texts] + [chunk("", finish)]
    events = [*enc.opening()] + [e for c in chunks for e in enc.encode(c)]
    with_choices = [e for e in events if e["choices"]]
    deltas = [e["choices"][0]["delta"] for e in with_choices]
    assert "".join(d.get("content", "") for d in deltas) == "".join(texts)
    assert [e["choices"][0]["finish_reason"] for e in with_choices].count(None) == len(deltas) - 1
    assert events[-1]["choices"] == []


def choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}


def test_sse_framing() -> None:
    event = sse_event({"text": "line\nbreak", "u": "é"})
    assert event.startswith(b"data: ")
    assert event.endswith(b"\n\n")
    assert event.count(b"\n") == 2  # a newline in a string is escaped, never splits the event
    assert json.loads(event[len(b"data: ") :]) == {"text": "line\nbreak", "u": "é"}
    assert DONE == b"data: [DONE]\n\n"
    assert KEEPALIVE.startswith(b":")
    assert KEEPALIVE.endswith(b"\n\n")
