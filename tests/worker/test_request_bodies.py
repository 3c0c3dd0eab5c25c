"""Request bodies held for tasks led here: taken once, bounded in bytes, expired unclaimed."""

from __future__ import annotations

import json

from trexo.types.generation import (
    ChatMessage,
    GenerationRequest,
    ResponseFormat,
    SamplingParams,
    ToolCall,
    ToolSpec,
)
from trexo.types.ids import NodeId, RequestId
from trexo.worker.request_bodies import RequestBodies, body_bytes


def body(rid: str, text: str = "hello") -> GenerationRequest:
    return GenerationRequest(RequestId(rid), messages=(ChatMessage("user", text),))


def test_a_body_is_held_until_taken_once() -> None:
    bodies = RequestBodies(ttl=30.0, max_bytes=1000)
    assert bodies.put(body("a"), now=0.0)
    assert "a" in bodies and bodies.bytes_held == body_bytes(body("a"))
    assert bodies.take(RequestId("a")) == body("a")
    assert bodies.take(RequestId("a")) is None
    assert bodies.bytes_held == 0


def test_bodies_beyond_the_byte_bound_are_refused() -> None:
    bodies = RequestBodies(ttl=30.0, max_bytes=2 * body_bytes(body("a", "x" * 60)) - 1)
    assert bodies.put(body("a", "x" * 60), now=0.0)
    assert not bodies.put(body("b", "y" * 60), now=0.0)
    assert bodies.held == {"a"} and bodies.refused == 1
    bodies.take(RequestId("a"))
    assert bodies.put(body("b", "y" * 60), now=1.0)


def test_unclaimed_bodies_expire_unless_their_task_waits() -> None:
    bodies = RequestBodies(ttl=30.0, max_bytes=10_000)
    bodies.put(body("gone"), now=0.0)
    bodies.put(body("waiting"), now=0.0)
    bodies.put(body("fresh"), now=20.0)
    assert bodies.expire(now=31.0, keep={"waiting"}) == ["gone"]
    assert bodies.held == {"waiting", "fresh"} and bodies.expired == 1


def test_the_bound_counts_the_whole_body_not_only_its_text() -> None:
    """Tools, a response schema and stop strings are held too: a body with one short
    message and megabytes of them must count as megabytes."""
    schema = json.dumps({"type": "object", "description": "s" * 20_000})
    heavy = GenerationRequest(
        RequestId("heavy"),
        messages=(ChatMessage("user", "hi"),),
        tools=tuple(ToolSpec(f"tool{i}", "d" * 5_000, schema) for i in range(4)),
        response_format=ResponseFormat("json_schema", schema),
        params=SamplingParams(stop=("x" * 5_000,)),
    )
    assert body_bytes(heavy) > 4 * 25_000 + 20_000 + 5_000
    bodies = RequestBodies(ttl=30.0, max_bytes=50_000)
    assert not bodies.put(heavy, now=0.0)
    assert bodies.held == frozenset() and bodies.refused == 1


def test_tool_calls_of_the_history_count() -> None:
    call = ToolCall("c1", "f", json.dumps({"a": "z" * 10_000}))
    history = GenerationRequest(
        RequestId("calls"), messages=(ChatMessage("assistant", "", tool_calls=(call,)),)
    )
    assert body_bytes(history) > 10_000


def test_a_body_is_taken_only_from_its_tasks_origin() -> None:
    # A rogue peer sends its own request for a task it learned the id of, before the origin.
    bodies = RequestBodies(ttl=30.0, max_bytes=10_000)
    rogue, origin = NodeId("x"), NodeId("o")
    assert bodies.put(body("a", "INJECTED"), now=0.0, origin=rogue)
    assert bodies.put(body("a"), now=0.1, origin=origin)  # held too: not a "resend"
    assert bodies.held_from == {(RequestId("a"), rogue), (RequestId("a"), origin)}
    assert bodies.take(RequestId("a"), origin=origin) == body("a")
    assert bodies.held_from == frozenset()  # the rogue's went with it
    assert bodies.bytes_held == 0
