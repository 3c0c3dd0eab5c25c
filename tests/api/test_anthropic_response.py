"""Building Anthropic messages, stream events and errors from trexo chunks, checked against
the official client's own types."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse

from trexo.api.anthropic_response import (
    MessageEvents,
    error_body,
    message_from_chunks,
    stop_reason,
)
from trexo.api.errors import ApiError
from trexo.types.chunks import Chunk, FinishReason, Usage
from trexo.types.generation import ToolCall
from trexo.types.ids import RequestId

RID = RequestId("msg_1")
WEATHER = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
CLOCK = ToolCall("call_2", "get_time", "{}")
EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)


def chunk(
    text: str = "",
    finish: FinishReason | None = None,
    usage: Usage | None = None,
    calls: tuple[ToolCall, ...] = (),
    tokens: int = 1,
) -> Chunk:
    return Chunk(RID, text, tuple(range(tokens)), finish, usage, calls)


def stream(chunks: list[Chunk], input_tokens: int = 4) -> list[dict[str, Any]]:
    """Every event for `chunks`, each checked against the client's event types."""
    events = MessageEvents(RID, "m", input_tokens)
    out = events.opening()
    for c in chunks:
        out += events.encode(c)
    assert events.finished
    for event in out:
        EVENT.validate_python(event)
    return out


def rebuilt(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The message a client builds from the events, as Anthropic's streaming docs say."""
    start, *rest = events
    message = json.loads(json.dumps(start["message"]))
    partial: dict[int, str] = {}
    for event in rest:
        match event["type"]:
            case "content_block_start":
                assert event["index"] == len(message["content"])
                message["content"].append(dict(event["content_block"]))
            case "content_block_delta":
                block = message["content"][event["index"]]
                if event["delta"]["type"] == "text_delta":
                    block["text"] += event["delta"]["text"]
                else:
                    partial[event["index"]] = partial.get(event["index"], "")
                    partial[event["index"]] += event["delta"]["partial_json"]
            case "content_block_stop":
                if event["index"] in partial:
                    message["content"][event["index"]]["input"] = json.loads(
                        partial[event["index"]]
                    )
            case "message_delta":
                message.update(event["delta"])
                message["usage"].update(event["usage"])
    assert events[-1] == {"type": "message_stop"}
    return message


@pytest.mark.parametrize(
    ("finish", "called", "expected"),
    [
        ("stop", False, "end_turn"),
        ("cancelled", False, "end_turn"),
        ("length", False, "max_tokens"),
        ("tool_calls", True, "tool_use"),
        ("stop", True, "tool_use"),
        ("length", True, "max_tokens"),
    ],
)
def test_stop_reasons(finish: FinishReason, called: bool, expected: str) -> None:
    assert stop_reason(finish, called=called) == expected


def test_a_stop_sequence_is_named_when_it_ended_the_turn() -> None:
    assert stop_reason("stop", called=False, stop_sequence="END") == "stop_sequence"
    assert stop_reason("stop", called=True, stop_sequence="END") == "tool_use"
    assert stop_reason("cancelled", called=False, stop_sequence=None) == "end_turn"


def test_error_is_not_a_stop_reason() -> None:
    with pytest.raises(ValueError, match="error"):
        stop_reason("error", called=False)


def test_a_text_message_is_anthropics_shape() -> None:
    chunks = [chunk("Hi"), chunk(" there."), chunk(finish="stop", usage=Usage(9, 3))]
    body = message_from_chunks(chunks, message_id=RID, model="m")
    assert body == {
        "id": RID,
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": "Hi there."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 9,
            "output_tokens": 3,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
    Message.model_validate(body)


def test_cached_prompt_tokens_are_cache_reads() -> None:
    body = message_from_chunks([chunk("x", "stop", Usage(100, 2, 60))], message_id=RID, model="m")
    usage = body["usage"]
    assert (usage["input_tokens"], usage["cache_read_input_tokens"]) == (40, 60)
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == 100


def test_tool_calls_are_tool_use_blocks() -> None:
    only_calls = message_from_chunks(
        [chunk(calls=(WEATHER, CLOCK)), chunk(finish="tool_calls", usage=Usage(5, 8))],
        message_id=RID,
        model="m",
    )
    assert only_calls["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_2", "name": "get_time", "input": {}},
    ]
    assert only_calls["stop_reason"] == "tool_use"
    Message.model_validate(only_calls)
    in_order = message_from_chunks(
        [chunk("Checking."), chunk(calls=(WEATHER,)), chunk("Done.", "stop", Usage(5, 8))],
        message_id=RID,
        model="m",
    )
    assert [block["type"] for block in in_order["content"]] == ["text", "tool_use", "text"]
    assert in_order["stop_reason"] == "tool_use"


def test_an_empty_answer_still_has_a_text_block() -> None:
    body = message_from_chunks([chunk(finish="stop", usage=Usage(5, 1))], message_id=RID, model="m")
    assert body["content"] == [{"type": "text", "text": ""}]


def test_streamed_text_events_in_anthropics_order() -> None:
    events = stream([chunk("Hel"), chunk("lo"), chunk("!", "stop", Usage(7, 3))])
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0]["message"]
    assert (start["content"], start["stop_reason"], start["usage"]) == (
        [],
        None,
        {"input_tokens": 4, "output_tokens": 0},
    )
    assert [e["delta"]["text"] for e in events if e["type"] == "content_block_delta"] == [
        "Hel",
        "lo",
        "!",
    ]
    assert events[-2]["usage"]["output_tokens"] == 3
    assert events[-2]["usage"]["input_tokens"] == 7  # the runner's count overrides


def test_streamed_tool_calls_are_blocks_with_their_input_as_json() -> None:
    events = stream(
        [
            chunk("Let me check."),
            chunk(calls=(WEATHER, CLOCK)),
            chunk(finish="tool_calls", usage=Usage(5, 9)),
        ]
    )
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [(e["index"], e["content_block"]["type"]) for e in starts] == [
        (0, "text"),
        (1, "tool_use"),
        (2, "tool_use"),
    ]
    assert starts[1]["content_block"] == {
        "type": "tool_use",
        "id": "call_1",
        "name": "get_weather",
        "input": {},
    }
    json_deltas = [e for e in events if e["type"] == "content_block_delta" and e["index"] > 0]
    assert [e["delta"] for e in json_deltas] == [
        {"type": "input_json_delta", "partial_json": WEATHER.arguments},
        {"type": "input_json_delta", "partial_json": CLOCK.arguments},
    ]
    # Each block stops before the next starts.
    opened: set[int] = set()
    for e in events:
        if e["type"] == "content_block_start":
            assert not opened
            opened.add(e["index"])
        elif e["type"] == "content_block_stop":
            opened.remove(e["index"])
    assert not opened
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize(
    "chunks",
    [
        [chunk("Hel"), chunk("lo"), chunk("!", "stop", Usage(7, 3))],
        [chunk("cut", "length", Usage(7, 1))],
        [chunk(finish="stop", usage=Usage(7, 1))],
        [chunk("so far"), chunk(finish="cancelled", usage=Usage(7, 2, 3))],
        [chunk(calls=(WEATHER,)), chunk(finish="tool_calls", usage=Usage(5, 9))],
        [chunk("a"), chunk(calls=(WEATHER,)), chunk("b", "stop", Usage(5, 9))],
    ],
)
def test_a_stream_rebuilds_the_non_streamed_message(chunks: list[Chunk]) -> None:
    message = rebuilt(stream(chunks))
    assert message == message_from_chunks(chunks, message_id=RID, model="m")


def test_usage_without_a_final_count_is_counted_from_tokens() -> None:
    events = stream([chunk("a", tokens=2), chunk("b", "stop", tokens=3)], input_tokens=6)
    assert events[-2]["usage"]["output_tokens"] == 5
    assert events[-2]["usage"]["input_tokens"] == 6


def test_nothing_is_encoded_after_the_end() -> None:
    events = MessageEvents(RID, "m")
    events.encode(chunk("a", "stop", Usage(1, 1)))
    assert events.encode(chunk("late")) == []


def test_an_error_ends_the_stream_with_an_error_event() -> None:
    events = MessageEvents(RID, "m")
    events.opening()
    events.encode(chunk("partial"))
    error = ApiError(500, "runner died", type="server_error", code="generation_failed")
    assert events.error(error) == [
        {"type": "error", "error": {"type": "api_error", "message": "runner died"}}
    ]
    assert events.finished


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (ApiError(400, "bad"), "invalid_request_error"),
        (ApiError(404, "no model"), "not_found_error"),
        (ApiError(405, "wrong method"), "invalid_request_error"),
        (ApiError(413, "too big"), "request_too_large"),
        (ApiError(500, "bug", type="server_error"), "api_error"),
        (ApiError(503, "electing", type="server_error", retry_after_s=1.0), "overloaded_error"),
        (ApiError(503, "no tokenizer here", type="server_error"), "api_error"),
    ],
)
def test_error_bodies_are_anthropics_shape(error: ApiError, kind: str) -> None:
    body = error_body(error)
    assert body == {"type": "error", "error": {"type": kind, "message": error.message}}
    if kind != "request_too_large":  # Anthropic's documented 413 type; the client's types lack it
        ErrorResponse.model_validate(body)
