"""The router's membership signal: `wait_peers_change`."""

from __future__ import annotations

import trio
import trio.testing

from trexo.net.router import Envelope, Router
from trexo.types.ids import NodeId

A, B, C = NodeId("a"), NodeId("b"), NodeId("c")


class NullLink:
    local_host = "127.0.0.1"

    async def send_envelope(self, envelope: Envelope) -> None:
        pass


async def test_wakes_on_attach_and_detach() -> None:
    router = Router(A)
    link = NullLink()
    seen: list[frozenset[NodeId]] = []

    async def watch() -> None:
        peers = router.peers
        while len(seen) < 2:
            peers = await router.wait_peers_change(peers)
            seen.append(peers)

    with trio.fail_after(1):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await trio.testing.wait_all_tasks_blocked()
            router.attach_link(B, link)
            await trio.testing.wait_all_tasks_blocked()
            router.detach_link(B, link)
    assert seen == [{B}, frozenset()]


async def test_returns_at_once_when_already_different() -> None:
    router = Router(A)
    router.attach_link(B, NullLink())
    with trio.fail_after(1):
        assert await router.wait_peers_change(frozenset()) == {B}


async def test_replacing_a_link_is_no_change() -> None:
    router = Router(A)
    old, new = NullLink(), NullLink()
    router.attach_link(B, old)
    woke = False

    async def watch() -> None:
        nonlocal woke
        await router.wait_peers_change(router.peers)
        woke = True

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        await trio.testing.wait_all_tasks_blocked()
        router.attach_link(B, new)  # a duplicate resolved: same peer, other link
        router.detach_link(B, old)  # the old link's late detach is a no-op
        await trio.testing.wait_all_tasks_blocked()
        assert not woke
        router.attach_link(C, NullLink())
        await trio.testing.wait_all_tasks_blocked()
        assert woke
