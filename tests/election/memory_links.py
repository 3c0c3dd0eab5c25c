"""In-process peer links between real `Router`s, for service tests.

`send_envelope` on one side hands the envelope to the other side's `deliver`, through the
wire codec as a real link would (so election messages must survive JSON). `connect` and
`disconnect` play the transport's `attach_link` / `detach_link` on both sides.
"""

from __future__ import annotations

import trio

from trexo import wire
from trexo.net.router import Envelope, Router
from trexo.net.topics import payload_type
from trexo.types.ids import NodeId


class MemoryLink:
    """This side's end of a link: what it sends arrives at `target`."""

    def __init__(self, target: Router) -> None:
        self.target = target
        self.closed = False

    local_host = "127.0.0.1"

    async def send_envelope(self, envelope: Envelope) -> None:
        if self.closed:
            raise trio.BrokenResourceError("link closed")
        kind = payload_type(envelope.topic)
        payload = wire.from_json(wire.to_json(envelope.payload, kind), kind)
        await self.target.deliver(Envelope(envelope.topic, envelope.sender, payload))


class MemoryNetwork:
    """The links between a set of routers."""

    def __init__(self) -> None:
        self._links: dict[frozenset[NodeId], tuple[Router, MemoryLink, Router, MemoryLink]] = {}

    def connect(self, a: Router, b: Router) -> None:
        to_b, to_a = MemoryLink(b), MemoryLink(a)
        self._links[frozenset({a.node_id, b.node_id})] = (a, to_b, b, to_a)
        a.attach_link(b.node_id, to_b)
        b.attach_link(a.node_id, to_a)

    def disconnect(self, a: Router, b: Router) -> None:
        x, to_y, y, to_x = self._links.pop(frozenset({a.node_id, b.node_id}))
        to_y.closed = to_x.closed = True
        x.detach_link(y.node_id, to_y)
        y.detach_link(x.node_id, to_x)

    def mesh(self, *routers: Router) -> None:
        for i, a in enumerate(routers):
            for b in routers[i + 1 :]:
                self.connect(a, b)

    def isolate(self, router: Router) -> None:
        """Cut every link of `router` (as when its process dies)."""
        for key in [k for k in self._links if router.node_id in k]:
            a, _, b, _ = self._links[key]
            self.disconnect(a, b)
