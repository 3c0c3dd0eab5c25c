"""Request bodies held for tasks led here: taken once, bounded in bytes, expired unclaimed."""

from __future__ import annotations

from trexo.types.generation import ChatMessage, GenerationRequest
from trexo.types.ids import RequestId
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
    bodies = RequestBodies(ttl=30.0, max_bytes=100)
    assert bodies.put(body("a", "x" * 60), now=0.0)
    assert not bodies.put(body("b", "y" * 60), now=0.0)
    assert bodies.held == {"a"} and bodies.refused == 1
    bodies.take(RequestId("a"))
    assert bodies.put(body("b", "y" * 60), now=1.0)


def test_unclaimed_bodies_expire_unless_their_task_waits() -> None:
    bodies = RequestBodies(ttl=30.0, max_bytes=1000)
    bodies.put(body("gone"), now=0.0)
    bodies.put(body("waiting"), now=0.0)
    bodies.put(body("fresh"), now=20.0)
    assert bodies.expire(now=31.0, keep={"waiting"}) == ["gone"]
    assert bodies.held == {"waiting", "fresh"} and bodies.expired == 1
