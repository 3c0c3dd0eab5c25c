"""The node's session tracker answers from whole states only: a new session's view that has
not caught up (its master has not opened it) is neither read from nor carried over.

A node that became master while its view of the last session was still partial used to
carry that part over: every placement it had not seen yet was lost, and its runners stopped.
"""

from __future__ import annotations

import trio
import trio.testing

from trexo.cluster_client import SessionTracker
from trexo.net.router import Envelope, Router
from trexo.net.topics import Topic
from trexo.types.events import IndexedEvent, NodeUpdated, SessionOpened
from trexo.types.ids import NodeId
from trexo.types.session import Session
from trexo.types.state import NodeInfo
from trexo.worker.state_view import StateView

BOUND_S = 10.0
ME = NodeId("me")


def node_event(session: Session, index: int, name: str) -> IndexedEvent:
    return IndexedEvent(session, index, NodeUpdated(NodeInfo(NodeId(name), "h", 100, 1)))


async def start_view(router: Router, session: Session, nursery: trio.Nursery) -> StateView:
    view: StateView = await nursery.start(StateView(router, session).run)
    return view


async def test_a_view_not_yet_opened_is_neither_read_nor_carried_over() -> None:
    router = Router(ME)
    tracker = SessionTracker()
    first, second = Session(1, ME), Session(2, NodeId("other"))
    with trio.fail_after(BOUND_S):
        async with trio.open_nursery() as nursery:
            view = await start_view(router, first, nursery)
            tracker.set_session(first, view)
            await router.publish(Topic.GLOBAL_EVENTS, node_event(first, 0, "a"))
            await router.publish(Topic.GLOBAL_EVENTS, IndexedEvent(first, 1, SessionOpened()))
            await view.wait_until(lambda state: state.opened)
            whole = tracker.state()
            assert set(whole.nodes) == {"a"} and tracker.opened

            partial = await start_view(router, second, nursery)
            tracker.set_session(None, None)
            tracker.set_session(second, partial)
            # The new master has sent part of its carried-over state, not all of it.
            # (from its master, as the view takes the session's events from no one else)
            await router.deliver(
                Envelope(Topic.GLOBAL_EVENTS, second.master_id, node_event(second, 0, "b"))
            )
            await partial.wait_until(lambda state: "b" in state.nodes)
            assert not tracker.opened
            assert tracker.state() is whole  # reads answer from the last whole state

            woken = trio.Event()

            async def wait_for_change() -> None:
                await tracker.wait_state_change(whole)
                woken.set()

            nursery.start_soon(wait_for_change)
            await trio.testing.wait_all_tasks_blocked()
            assert not woken.is_set()  # a partial state is no change to the reader
            # The session changes again before it opened: the whole state is kept.
            tracker.set_session(None, None)
            assert tracker.last_state is whole
            await woken.wait()  # the session change woke the waiter
            nursery.cancel_scope.cancel()


async def test_a_waiter_wakes_when_the_new_session_opens() -> None:
    router = Router(ME)
    tracker = SessionTracker()
    session = Session(3, ME)
    with trio.fail_after(BOUND_S):
        async with trio.open_nursery() as nursery:
            view = await start_view(router, session, nursery)
            tracker.set_session(session, view)
            seen = tracker.state()
            woken: list[bool] = []
            woke = trio.Event()

            async def wait_for_change() -> None:
                await tracker.wait_state_change(seen)
                woken.append(tracker.opened)
                woke.set()

            nursery.start_soon(wait_for_change)
            await router.publish(Topic.GLOBAL_EVENTS, node_event(session, 0, "c"))
            await view.wait_until(lambda state: "c" in state.nodes)
            await trio.testing.wait_all_tasks_blocked()
            assert woken == []
            await router.publish(Topic.GLOBAL_EVENTS, IndexedEvent(session, 1, SessionOpened()))
            await woke.wait()
            assert woken == [True]
            assert set(tracker.state().nodes) == {"c"}
            nursery.cancel_scope.cancel()
