"""Request bodies that came point-to-point for tasks this node's runners lead, held until
the task is forwarded to its runner.

A body and its task (`TaskCreated`, from the master) arrive on different paths, in either
order; the worker forwards a task once both are here. What is held is bounded: a body
unclaimed after `ttl` seconds whose task is not in the state (it was cancelled, or its
session lost it) is dropped, and bodies beyond `max_bytes` in all are refused (logged; the
task then ends when its origin gives up or leaves). Pure bookkeeping: the caller passes
`now`.
"""

from __future__ import annotations

import logging
from collections.abc import Container

import attrs

from trexo.types.generation import GenerationRequest
from trexo.types.ids import RequestId

log = logging.getLogger(__name__)


def body_bytes(request: GenerationRequest) -> int:
    """About what `request` holds in memory: its text (the rest is a few small fields)."""
    if request.prompt is not None:
        return len(request.prompt)
    return sum(len(m.content) + len(m.role) for m in request.messages or ())


@attrs.define
class _Held:
    request: GenerationRequest
    size: int
    arrived: float


class RequestBodies:
    def __init__(self, *, ttl: float, max_bytes: int) -> None:
        self._ttl = ttl
        self._max_bytes = max_bytes
        self._held: dict[RequestId, _Held] = {}
        self._bytes = 0
        self.refused = 0
        self.expired = 0

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._held

    @property
    def held(self) -> frozenset[RequestId]:
        return frozenset(self._held)

    @property
    def bytes_held(self) -> int:
        return self._bytes

    def put(self, request: GenerationRequest, now: float) -> bool:
        """Hold `request`; False if it would pass the byte bound (it is then dropped)."""
        rid = request.request_id
        size = body_bytes(request)
        if rid in self._held:
            return True  # a resend
        if self._bytes + size > self._max_bytes:
            self.refused += 1
            log.warning(
                "dropped the request of task %s (%d B): %d B of requests already wait",
                rid,
                size,
                self._bytes,
            )
            return False
        self._held[rid] = _Held(request, size, now)
        self._bytes += size
        return True

    def take(self, request_id: RequestId) -> GenerationRequest | None:
        held = self._held.pop(request_id, None)
        if held is None:
            return None
        self._bytes -= held.size
        return held.request

    def expire(self, now: float, keep: Container[RequestId]) -> list[RequestId]:
        """Drop bodies older than the ttl whose task is not in `keep`; returns their ids."""
        old = [
            rid
            for rid, held in self._held.items()
            if now - held.arrived > self._ttl and rid not in keep
        ]
        for rid in old:
            self.take(rid)
        self.expired += len(old)
        return old
