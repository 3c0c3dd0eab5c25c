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
from trexo.types.ids import NodeId, RequestId
from trexo.wire import to_json

log = logging.getLogger(__name__)


def body_bytes(request: GenerationRequest) -> int:
    """About what `request` holds in memory: its size on the wire, every field counted
    (tools, schemas, stop strings and tool calls can be most of a body, not its text)."""
    return len(to_json(request, GenerationRequest))


@attrs.define
class _Held:
    request: GenerationRequest
    size: int
    arrived: float


_Key = tuple[RequestId, NodeId | None]
"""A body by its task and the node that sent it (None: not known)."""


class RequestBodies:
    """Bodies by task and sender: a task runs the body its origin sent (`take`), never one
    another peer sent first for the same id (every node learns every task's id)."""

    def __init__(self, *, ttl: float, max_bytes: int) -> None:
        self._ttl = ttl
        self._max_bytes = max_bytes
        self._held: dict[_Key, _Held] = {}
        self._bytes = 0
        self.refused = 0
        self.expired = 0

    def __contains__(self, request_id: object) -> bool:
        return any(rid == request_id for rid, _ in self._held)

    @property
    def held(self) -> frozenset[RequestId]:
        return frozenset(rid for rid, _ in self._held)

    @property
    def held_from(self) -> frozenset[tuple[RequestId, NodeId]]:
        """Each held body's task, with the node that sent it."""
        return frozenset((rid, origin) for rid, origin in self._held if origin is not None)

    @property
    def bytes_held(self) -> int:
        return self._bytes

    def put(self, request: GenerationRequest, now: float, *, origin: NodeId | None = None) -> bool:
        """Hold `request`, sent by `origin`; False if it would pass the byte bound (it is
        then dropped)."""
        rid = request.request_id
        size = body_bytes(request)
        if (rid, origin) in self._held:
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
        self._held[(rid, origin)] = _Held(request, size, now)
        self._bytes += size
        return True

    def take(
        self, request_id: RequestId, *, origin: NodeId | None = None
    ) -> GenerationRequest | None:
        """The body `origin` sent for `request_id`, if held; what others sent for that task
        goes with it (dropped, with a log line)."""
        held = self._pop((request_id, origin))
        if held is None:
            return None
        for other in [key for key in self._held if key[0] == request_id]:
            self._pop(other)
            log.warning(
                "dropped a request for task %s from %s: only its origin's (%s) runs",
                request_id,
                other[1],
                origin,
            )
        return held.request

    def _pop(self, key: _Key) -> _Held | None:
        held = self._held.pop(key, None)
        if held is not None:
            self._bytes -= held.size
        return held

    def expire(self, now: float, keep: Container[RequestId]) -> list[RequestId]:
        """Drop bodies older than the ttl whose task is not in `keep`; returns their ids."""
        old = [
            key
            for key, held in self._held.items()
            if now - held.arrived > self._ttl and key[0] not in keep
        ]
        for key in old:
            self._pop(key)
        self.expired += len(old)
        return [rid for rid, _ in old]
