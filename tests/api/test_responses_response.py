"""Building Responses objects and stream events from chunks. Every body and event is checked
against the official client's own (pydantic) models, strictly."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types import responses as oa

from trexo.api.errors import ApiError
from trexo.api.responses_request import ResponsesRequest, parse_responses_request
from trexo.api.responses_response import (
    ResponseEvents,
    response_from_chunks,
    response_status,
)
from trexo.types.chunks import Chunk, FinishReason, Usage
from trexo.types.generation import ToolCall
from trexo.types.ids import RequestId

RID = RequestId("resp_abc")
CREATED = 1_700_000_000
WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
CALL = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
USAGE = Usage(prompt_tokens=7, completion_tokens=3, cached_tokens=4)

EVENT_MODELS: dict[str, type[pydantic.BaseModel]] = {
    "response.created": oa.ResponseCreatedEvent,
    "response.in_progress": oa.ResponseInProgressEvent,
    "response.output_item.added": oa.ResponseOutputItemAddedEvent,
    "response.output_item.done": oa.ResponseOutputItemDoneEvent,
    "response.content_part.added": oa.ResponseContentPartAddedEvent,
    "response.content_part.done": oa.ResponseContentPartDoneEvent,
    "response.output_text.delta": oa.ResponseTextDeltaEvent,
    "response.output_text.done": oa.ResponseTextDoneEvent,
    "response.function_call_arguments.delta": oa.ResponseFunctionCallArgumentsDeltaEvent,
    "response.function_call_arguments.done": oa.ResponseFunctionCallArgumentsDoneEvent,
    "response.completed": oa.ResponseCompletedEvent,
    "response.incomplete": oa.ResponseIncompleteEvent,
    "response.failed": oa.ResponseFailedEvent,
    "error": oa.ResponseErrorEvent,
}


def request(**fields: Any) -> ResponsesRequest:
    return parse_responses_request({"model": "m", "input": "hi", **fields}, RID)


def chunk(
    text: str = "",
    *,
    tokens: int = 1,
    finish: FinishReason | None = None,
    usage: Usage | None = None,
    calls: tuple[ToolCall, ...] = (),
) -> Chunk:
    return Chunk(
        RID,
        text,
        token_ids=tuple(range(tokens)),
        finish_reason=finish,
        usage=usage,
        tool_calls=calls,
    )


def validated(body: dict[str, Any]) -> oa.Response:
    return oa.Response.model_validate(body, strict=True)


def stream(events: ResponseEvents, *chunks: Chunk) -> list[dict[str, Any]]:
    """The whole stream's events, each checked against the client's model for its type."""
    out = events.opening()
    for item in chunks:
        out += events.encode(item)
    for event in out:
        EVENT_MODELS[event["type"]].model_validate(event, strict=True)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def test_statuses() -> None:
    assert response_status("stop") == "completed"
    assert response_status("tool_calls") == "completed"
    assert response_status("cancelled") == "completed"
    assert response_status("length") == "incomplete"
    with pytest.raises(ValueError):
        response_status("error")


def test_a_text_response() -> None:
    chunks = [chunk("Hello"), chunk(" world", finish="stop", usage=USAGE)]
    body = response_from_chunks(chunks, request(instructions="Be kind."), CREATED)
    response = validated(body)
    assert (response.id, response.object, response.status) == (RID, "response", "completed")
    assert (response.created_at, response.model) == (CREATED, "m")
    assert response.output_text == "Hello world"
    [message] = response.output
    assert message.type == "message"
    assert (message.id, message.role, message.status) == ("msg_abc_0", "assistant", "completed")
    assert response.incomplete_details is None and response.error is None
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (7, 3)
    assert response.usage.total_tokens == 10
    assert response.usage.input_tokens_details.cached_tokens == 4
    assert response.instructions == "Be kind."


def test_a_tool_call_response_has_a_function_call_item_and_no_empty_message() -> None:
    chunks = [chunk(calls=(CALL,), finish="tool_calls", usage=USAGE)]
    response = validated(response_from_chunks(chunks, request(tools=[WEATHER]), CREATED))
    [item] = response.output
    assert item.type == "function_call"
    assert (item.id, item.call_id, item.name) == ("fc_abc_0", "call_1", "get_weather")
    assert (item.arguments, item.status) == ('{"city": "Paris"}', "completed")
    assert response.tools[0].type == "function"
    assert response.tools[0].name == "get_weather"
    assert response.output_text == ""


def test_text_before_calls_comes_first() -> None:
    second = ToolCall("call_2", "get_weather", '{"city": "Rome"}')
    chunks = [chunk("Looking."), chunk(calls=(CALL, second), finish="tool_calls")]
    response = validated(response_from_chunks(chunks, request(tools=[WEATHER]), CREATED))
    assert [item.type for item in response.output] == ["message", "function_call", "function_call"]
    assert [item.id for item in response.output] == ["msg_abc_0", "fc_abc_1", "fc_abc_2"]


def test_length_leaves_the_response_incomplete() -> None:
    chunks = [chunk("Hel"), chunk("lo", finish="length")]
    response = validated(response_from_chunks(chunks, request(max_output_tokens=2), CREATED))
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    [message] = response.output
    assert message.type == "message" and message.status == "incomplete"
    assert response.max_output_tokens == 2
    assert response.output_text == "Hello"


def test_an_empty_answer_is_an_empty_message() -> None:
    response = validated(response_from_chunks([chunk(finish="stop")], request(), CREATED))
    [message] = response.output
    assert message.type == "message"
    assert response.output_text == ""


def test_stream_of_text() -> None:
    events = stream(
        ResponseEvents(request(), CREATED),
        chunk("Hel"),
        chunk(""),  # nothing to say
        chunk("lo", finish="stop", usage=USAGE),
    )
    assert types(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    created = validated(events[0]["response"])
    assert (created.status, created.output, created.usage) == ("in_progress", [], None)
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == [
        "Hel",
        "lo",
    ]
    assert events[6]["text"] == "Hello"
    final = validated(events[-1]["response"])
    assert final.output_text == "Hello"
    assert final.usage is not None and final.usage.total_tokens == 10
    assert events[-1]["response"]["output"] == [events[8]["item"]]


def test_stream_of_a_call_after_text() -> None:
    events = stream(
        ResponseEvents(request(tools=[WEATHER]), CREATED),
        chunk("Looking."),
        chunk(calls=(CALL,), finish="tool_calls", usage=USAGE),
    )
    assert types(events)[2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added, delta, done, item_done = events[8:12]
    assert added["output_index"] == 1
    assert added["item"]["arguments"] == "" and added["item"]["status"] == "in_progress"
    assert delta["delta"] == done["arguments"] == CALL.arguments
    assert delta["item_id"] == added["item"]["id"] == item_done["item"]["id"] == "fc_abc_1"
    final = validated(events[-1]["response"])
    assert [item.type for item in final.output] == ["message", "function_call"]


def test_text_after_a_call_opens_another_message() -> None:
    events = stream(
        ResponseEvents(request(tools=[WEATHER]), CREATED),
        chunk(calls=(CALL,)),
        chunk("Done.", finish="stop"),
    )
    final = validated(events[-1]["response"])
    assert [(item.type, item.id) for item in final.output] == [
        ("function_call", "fc_abc_0"),
        ("message", "msg_abc_1"),
    ]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [(e["item_id"], e["output_index"]) for e in deltas] == [("msg_abc_1", 1)]


def test_stream_cut_by_length_is_incomplete() -> None:
    events = stream(ResponseEvents(request(), CREATED), chunk("Hel"), chunk("lo", finish="length"))
    assert events[-1]["type"] == "response.incomplete"
    final = validated(events[-1]["response"])
    assert final.status == "incomplete"
    [message] = final.output
    assert message.type == "message" and message.status == "incomplete"
    assert final.usage is not None and final.usage.output_tokens == 2  # counted


def test_an_empty_stream_still_has_a_message() -> None:
    events = stream(ResponseEvents(request(), CREATED), chunk(finish="stop", tokens=0))
    assert "response.output_item.added" in types(events)
    assert validated(events[-1]["response"]).output_text == ""


def test_stream_error_is_an_error_event_then_failed() -> None:
    encoder = ResponseEvents(request(), CREATED)
    events = stream(encoder, chunk("partial"))
    failure = ApiError(500, "runner died", type="server_error", code="generation_failed")
    tail = encoder.error(failure)
    for event in tail:
        EVENT_MODELS[event["type"]].model_validate(event, strict=True)
    error, failed = tail
    assert error == {
        "type": "error",
        "sequence_number": len(events),
        "code": "generation_failed",
        "message": "runner died",
        "param": None,
    }
    assert failed["sequence_number"] == len(events) + 1
    response = validated(failed["response"])
    assert response.status == "failed"
    assert response.error is not None and response.error.message == "runner died"
    assert response.output_text == "partial"
    assert encoder.finished
    assert encoder.encode(chunk("more")) == []


def test_nothing_after_the_end() -> None:
    encoder = ResponseEvents(request(), CREATED)
    stream(encoder, chunk("a", finish="stop"))
    assert encoder.finished
    assert encoder.encode(chunk("b")) == []


@given(
    texts=st.lists(st.text(max_size=5), max_size=6),
    finish=st.sampled_from(["stop", "length", "cancelled"]),
)
def test_stream_deltas_add_up_to_the_non_streamed_text(texts: list[str], finish: Any) -> None:
    chunks = [chunk(text) for text in texts] + [chunk("", finish=finish, usage=USAGE)]
    events = stream(ResponseEvents(request(), CREATED), *chunks)
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    whole = validated(response_from_chunks(chunks, request(), CREATED))
    assert deltas == whole.output_text == "".join(texts)
    final = validated(events[-1]["response"])
    assert final.model_dump()["output"] == whole.model_dump()["output"]
    assert final.status == whole.status
