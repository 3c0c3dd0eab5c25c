"""Failure detection that tells slow from dead: a peer paused for less than `lost_after` keeps
its links; a silent peer other nodes still hear is kept longer (indirect probes); a node
that was itself stalled does not accuse the peers it could not hear; a frozen peer nobody
hears is still dropped within the bound (`test_transport`)."""

from __future__ import annotations

import logging
import time

import pytest
import trio

from tests.waiting import holds_for, wait_until

from .helpers import FAST, TEST_TIMEOUT_S, FreezableProxy, logged, start_node, wait_peers

LOG = "trexo.net"


async def test_a_peer_paused_for_less_than_the_bound_keeps_its_link(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a")
            b = await start_node(nursery, "b")
            proxy = FreezableProxy(b.port)
            assert await a.transport.connect("127.0.0.1", await nursery.start(proxy.run)) == "b"
            for _ in range(3):  # as a process paused again and again (GC, a starved loop)
                proxy.freeze()
                await trio.sleep(FAST.lost_after * 0.6)
                proxy.thaw()
                await trio.sleep(FAST.lost_after)
            assert a.router.peers == {"b"} and b.router.peers == {"a"}
            assert logged(caplog, "peer b is suspect")  # it was suspect, never lost
            assert not logged(caplog, "lost peer")
            nursery.cancel_scope.cancel()


async def test_a_silent_peer_that_others_hear_is_kept_longer_then_relinked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a")
            b = await start_node(nursery, "b")
            c = await start_node(nursery, "c")
            proxy = FreezableProxy(b.port)  # only the a-b path freezes: b itself is fine
            assert await a.transport.connect("127.0.0.1", await nursery.start(proxy.run)) == "b"
            await c.connect(a)
            await c.connect(b)
            await wait_peers(a.router, "bc")
            await wait_peers(b.router, "ac")
            assert a.transport._links["b"].address.endswith(f":{proxy.port}")
            proxy.freeze()
            frozen = trio.current_time()
            # Past the plain bound, the link holds: c vouched for b.
            await holds_for(
                lambda: a.router.peers == {"b", "c"},
                seconds=FAST.lost_after + 3 * FAST.heartbeat_interval,
                what="a's link to b, vouched for by c",
            )
            assert logged(caplog, "peer b is alive: c heard it")
            await wait_until(
                lambda: logged(caplog, "lost peer b", "though another node heard it"),
                timeout=FAST.vouched_lost_after + 2.0,
                what="the silent link closed at the longer bound",
            )
            took = trio.current_time() - frozen
            assert took >= FAST.vouched_lost_after - FAST.heartbeat_interval
            await wait_peers(a.router, "bc")  # linked again, by the way gossip knows b
            assert not a.transport._links["b"].address.endswith(f":{proxy.port}")
            nursery.cancel_scope.cancel()


async def test_a_node_whose_own_loop_stalled_does_not_accuse_its_peers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    pause = 1.0
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            # a's own bound is shorter than its pause; b tolerates it.
            a = await start_node(nursery, "a", lost_after=0.5, suspect_after=0.3)
            b = await start_node(nursery, "b", lost_after=3.0, suspect_after=2.0)
            await b.connect(a)
            await wait_peers(a.router, "b")
            await trio.sleep(0.3)
            time.sleep(pause)  # a's (and b's) event loop stalls, as in a GC pause
            await holds_for(
                lambda: a.router.peers == {"b"},
                seconds=1.0,
                what="a's link to b after a's own stall",
            )
            assert not logged(caplog, "lost peer")
            nursery.cancel_scope.cancel()
