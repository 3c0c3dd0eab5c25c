"""The router: topic fan-out between this node's services and its peers.

Above the router nothing knows whether a message crosses a process boundary. A cluster of
one delivers everything in-process; the transport (peer links) plugs in underneath through
`attach_link` and calls `deliver` for what arrives.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any, Protocol

import attrs
import trio

from trexo.errors import TrexoError
from trexo.net.topics import Topic
from trexo.types.ids import NodeId

log = logging.getLogger(__name__)

SUBSCRIBER_BUFFER = 4096
"""Messages a subscriber may fall behind before publishers wait for it."""


class PeerUnreachable(TrexoError):
    """A point-to-point send named a node this router has no link to."""


@attrs.frozen
class Envelope:
    topic: Topic
    sender: NodeId
    payload: Any


class PeerLink(Protocol):
    """What the router needs of a link to one peer (implemented by the transport)."""

    async def send_envelope(self, envelope: Envelope) -> None: ...

    @property
    def local_host(self) -> str | None:
        """This node's IP on the link: where the peer reaches this node (None: unknown)."""
        ...


class Router:
    def __init__(self, node_id: NodeId) -> None:
        self.node_id = node_id
        self._subscribers: dict[Topic, list[trio.MemorySendChannel[Envelope]]] = {
            topic: [] for topic in Topic
        }
        self._links: dict[NodeId, PeerLink] = {}
        self._peers_changed = trio.Event()

    # --- subscribing ------------------------------------------------------------------------

    @contextmanager
    def subscribe(self, topic: Topic) -> Iterator[trio.MemoryReceiveChannel[Envelope]]:
        """Receive every message on `topic` that reaches this node, while the block runs."""
        send, receive = trio.open_memory_channel[Envelope](SUBSCRIBER_BUFFER)
        self._subscribers[topic].append(send)
        try:
            with receive:
                yield receive
        finally:
            self._subscribers[topic].remove(send)
            send.close()

    # --- sending ----------------------------------------------------------------------------

    @property
    def peers(self) -> frozenset[NodeId]:
        return frozenset(self._links)

    def local_host(self, peer: NodeId) -> str | None:
        """This node's address as `peer` reaches it (the local end of our link), if linked."""
        link = self._links.get(peer)
        return link.local_host if link is not None else None

    async def publish(self, topic: Topic, payload: object) -> None:
        """Send to every node of the cluster, this one included."""
        envelope = Envelope(topic, self.node_id, payload)
        for peer, link in list(self._links.items()):
            await self._send_to_link(peer, link, envelope)
        await self.deliver(envelope)

    async def send(self, node_id: NodeId, topic: Topic, payload: object) -> None:
        """Send to one node (this one included). `PeerUnreachable` if there is no link."""
        envelope = Envelope(topic, self.node_id, payload)
        if node_id == self.node_id:
            await self.deliver(envelope)
            return
        link = self._links.get(node_id)
        if link is None:
            raise PeerUnreachable(f"no link to node {node_id}")
        await self._send_to_link(node_id, link, envelope)

    async def _send_to_link(self, peer: NodeId, link: PeerLink, envelope: Envelope) -> None:
        try:
            await link.send_envelope(envelope)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # The transport notices the closed link and detaches it; nothing to do here.
            log.debug("dropped %s message to %s: link closing", envelope.topic.value, peer)

    async def deliver(self, envelope: Envelope) -> None:
        """Hand an arrived (or local) message to this node's subscribers of its topic."""
        for channel in list(self._subscribers[envelope.topic]):
            with suppress(trio.ClosedResourceError):  # unsubscribed while we delivered
                await channel.send(envelope)

    # --- the transport's side ---------------------------------------------------------------

    def attach_link(self, node_id: NodeId, link: PeerLink) -> None:
        """Route messages for `node_id` through `link` (replacing any previous link to it)."""
        joined = node_id not in self._links
        self._links[node_id] = link
        if joined:
            self._notify_peers_changed()

    def detach_link(self, node_id: NodeId, link: PeerLink) -> None:
        """Forget `link`; a no-op if `node_id` is now routed through another link."""
        if self._links.get(node_id) is link:
            del self._links[node_id]
            self._notify_peers_changed()

    # --- membership ---------------------------------------------------------------------------

    def _notify_peers_changed(self) -> None:
        # One event per generation of the peer set: waiters of the old one wake, later
        # waiters wait on the fresh one.
        self._peers_changed.set()
        self._peers_changed = trio.Event()

    async def wait_peers_change(self, previous: frozenset[NodeId]) -> frozenset[NodeId]:
        """Wait until the set of linked peers differs from `previous`; return the new set.

        Returns at once if it already differs, so a caller that loops
        `peers = await router.wait_peers_change(peers)` misses no change. It wakes in the same
        scheduling step as the transport's `attach_link`/`detach_link`: a peer whose socket
        closed is reported within milliseconds. A link replaced by another to the same peer
        (duplicate resolution) is no change. The wait is unbounded: bound it at the caller.
        """
        while (current := self.peers) == previous:
            await self._peers_changed.wait()
        return current
