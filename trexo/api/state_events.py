"""`GET /state/events`: the cluster as this node sees it, pushed as server-sent events.

Each event is one `data: {json}` line (`cluster_event`): this node's id, the session it
follows (master and clock; null while it elects one), a one-word status, whether each
instance can serve and why not, and the state exactly as `GET /state` answers it. The first
event goes out at once, the next whenever the session or the state changes, and a
`: keep-alive` comment during long silences. The dashboard draws everything live from it;
a script can follow it the same way (`curl -N .../state/events`).

The stream is node-lifetime, like the API: it goes on across elections, so a page loaded
from a node keeps following the cluster while that node becomes a follower or the master.

Bounded: at most `max_event_streams` at once (more get 503); a burst of changes is sent as
its last state, at most one event per `events_min_interval`; a client that has not taken an
event for `stalled_client_timeout` is dropped. A stream holds one event, never a backlog.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import trio

from trexo.api.errors import SERVER_ERROR, ApiError
from trexo.api.exchange import exchange_nursery
from trexo.api.handle import NodeHandle
from trexo.api.sse import KEEPALIVE, sse_event
from trexo.api.streaming import hand_over
from trexo.availability import cluster_status, instance_availability, problems
from trexo.config import ApiConfig
from trexo.types.ids import NodeId
from trexo.types.session import Session
from trexo.types.state import State
from trexo.wire import converter

log = logging.getLogger(__name__)


def cluster_event(node_id: NodeId, session: Session | None, state: State) -> dict[str, Any]:
    """One `/state/events` event: what a picture of the cluster needs, all of it public."""
    found = problems(state)
    availability = {}
    for instance_id, instance in state.instances.items():
        available = instance_availability(state, instance)
        availability[instance_id] = {"serving": available.serving, "reason": available.reason}
    return {
        "node_id": node_id,
        "session": None if session is None else converter.unstructure(session, Session),
        "status": cluster_status(session, found),
        "problems": found,
        "availability": availability,
        "state": converter.unstructure(state, State),
    }


class StateEvents:
    """The `/state/events` streams of one app: each follows `node` for its client."""

    def __init__(self, node: NodeHandle, config: ApiConfig) -> None:
        self._node = node
        self._config = config
        self._streams = trio.CapacityLimiter(config.max_event_streams)

    def open(self) -> AsyncIterator[bytes]:
        """Start following the cluster in this request's exchange nursery; returns the body.

        Raises a 503 `ApiError` when `max_event_streams` are open already.
        """
        stream = object()
        try:
            self._streams.acquire_on_behalf_of_nowait(stream)
        except trio.WouldBlock:
            raise ApiError(
                503,
                f"{int(self._streams.total_tokens)} event streams are open, the most this "
                "node serves at once; retry shortly",
                type=SERVER_ERROR,
                code="too_many_event_streams",
                retry_after_s=self._config.retry_after,
            ) from None
        send, receive = trio.open_memory_channel[bytes](0)
        exchange = exchange_nursery()
        # The task always runs, even if the client is already gone: it releases the slot.
        exchange.start_soon(self._follow, stream, send, exchange)
        return _body(receive)

    async def _follow(
        self, stream: object, send: trio.MemorySendChannel[bytes], exchange: trio.Nursery
    ) -> None:
        config = self._config
        node = self._node
        try:
            async with send:
                retry = f"retry: {config.events_retry_ms}\n\n".encode()
                if not await self._send(send, retry, exchange):
                    return
                sent = b""
                while True:
                    session, state = node.current_session(), node.current_state()
                    event = sse_event(cluster_event(node.node_id, session, state))
                    if event != sent:
                        if not await self._send(send, event, exchange):
                            return
                        sent = event
                        await trio.sleep(config.events_min_interval)  # what changes meanwhile waits
                    with trio.move_on_after(config.keepalive_interval) as silence:
                        await node.wait_cluster_change(session, state)
                    if silence.cancelled_caught and not await self._send(send, KEEPALIVE, exchange):
                        return
        finally:
            self._streams.release_on_behalf_of(stream)

    async def _send(
        self, send: trio.MemorySendChannel[bytes], data: bytes, exchange: trio.Nursery
    ) -> bool:
        """Hand `data` to the body; False if the client left or stalled (its exchange ends)."""
        timeout = self._config.stalled_client_timeout
        with trio.move_on_after(timeout):
            return await hand_over(send, data)
        log.info("a /state/events client has not read for %g s; dropping it", timeout)
        exchange.cancel_scope.cancel()
        return False


async def _body(receive: trio.MemoryReceiveChannel[bytes]) -> AsyncIterator[bytes]:
    async with receive:
        async for data in receive:
            yield data
