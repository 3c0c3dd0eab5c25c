"""A node's view of the cluster state: the session's indexed events, applied in order.

`StateView` subscribes to `global_events`, keeps events of its own session (sent by its
master) only, drops duplicates, buffers early arrivals, and repairs gaps by asking the
master for a replay (`RequestReplay` on `commands`, at most one outstanding, re-asked every
`replay_retry` seconds while the gap persists). It asks for a replay from 0 as soon as it
starts, so a late joiner catches up the same way a node that missed one event does; until it
has applied anything it keeps asking, because a request sent before the master listened is
lost. A
replay from before the master's last snapshot starts with that snapshot (`StateSnapshot`):
the view takes its state as it is and goes on from the event after it, so catching up costs
one snapshot and the events since, however long the session has run.

Waiting for changes, without polling:

    state = view.state
    while True:
        replan(state)
        state = await view.wait_state_change(state.last_index)

`wait_state_change(after_index)` returns the current state as soon as its `last_index` is
past `after_index`; several events applied at once wake a waiter once, with the newest state
(a planner wants the latest state, not every intermediate one). `wait_until(predicate)`
suits an API that waits for e.g. an instance to become ready. A view that stops (its
session is over) does not wake its waiters: bound the wait (`trio.fail_after`) or race it
against the session change, as a node-lifetime caller must anyway.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import attrs
import trio

from trexo.config import StateViewConfig
from trexo.net.router import Envelope, PeerUnreachable, Router
from trexo.net.topics import Topic
from trexo.state import apply
from trexo.trace import trace
from trexo.types.commands import RequestReplay
from trexo.types.events import IndexedEvent
from trexo.types.ids import new_id
from trexo.types.session import Session
from trexo.types.snapshot import StateSnapshot
from trexo.types.state import State

log = logging.getLogger(__name__)


# --- ordering (pure) -----------------------------------------------------------------------


class ReorderBuffer:
    """Releases a session's events in index order, whatever order they arrive in."""

    def __init__(self, max_pending: int, next_index: int = 0) -> None:
        self.next_index = next_index
        """The index of the next event to release."""
        self.max_pending = max_pending
        self._pending: dict[int, IndexedEvent] = {}
        self._highest_seen = next_index - 1  # remembers a gap even if its events overflowed
        self.duplicates = 0
        self.overflowed = 0

    @property
    def pending(self) -> int:
        """Events held back, waiting for an earlier one."""
        return len(self._pending)

    @property
    def has_gap(self) -> bool:
        """Whether an event has been seen that cannot be released yet."""
        return self._highest_seen >= self.next_index

    def offer(self, event: IndexedEvent) -> list[IndexedEvent]:
        """Take `event`; return the events it lets out, in order (often `[event]`)."""
        if event.index < self.next_index or event.index in self._pending:
            self.duplicates += 1
            return []
        self._highest_seen = max(self._highest_seen, event.index)
        if event.index > self.next_index:
            if len(self._pending) >= self.max_pending:
                self.overflowed += 1  # the replay that fills the gap brings it again
            else:
                self._pending[event.index] = event
            return []
        self.next_index += 1
        return [event, *self._release()]

    def skip_to(self, next_index: int) -> list[IndexedEvent]:
        """Everything before `next_index` is covered (by a snapshot): release what follows."""
        if next_index <= self.next_index:
            return []
        self.next_index = next_index
        self._pending = {k: e for k, e in self._pending.items() if k >= next_index}
        return self._release()

    def _release(self) -> list[IndexedEvent]:
        ready = []
        while (following := self._pending.pop(self.next_index, None)) is not None:
            ready.append(following)
            self.next_index += 1
        return ready


# --- the service ---------------------------------------------------------------------------


@attrs.frozen
class StateViewStatistics:
    """A snapshot of a `StateView`, in the style of trio's `statistics()` objects."""

    session: Session
    last_index: int
    events_applied: int
    duplicates_dropped: int
    pending: int
    """Events held back behind a gap."""
    overflowed: int
    """Early events dropped because too many were held back already."""
    replay_requests: int
    snapshots_applied: int
    """Replays answered with a snapshot that took this view forward."""
    foreign_dropped: int
    """Events of another session."""
    payloads_dropped: int
    """Messages on `global_events` that were not indexed events, or not from the master."""


class StateView:
    """The state of one session as this node sees it. `await nursery.start(view.run)`."""

    def __init__(
        self, router: Router, session: Session, *, config: StateViewConfig | None = None
    ) -> None:
        self.router = router
        self.session = session
        self.config = config or StateViewConfig()
        self._state = State()
        self._buffer = ReorderBuffer(self.config.max_pending)
        self._changed = trio.Event()  # set and replaced on every change
        self._replay_deadline = math.inf  # of the outstanding replay request, if any
        self._events_applied = 0
        self._replay_requests = 0
        self._snapshots_applied = 0
        self._caught_up = False
        self._foreign_dropped = 0
        self._payloads_dropped = 0

    @property
    def state(self) -> State:
        """The state after every event applied so far (`State()` before the first)."""
        return self._state

    async def wait_state_change(self, after_index: int) -> State:
        """The state, once it has applied an event with an index past `after_index`."""
        return await self.wait_until(lambda state: state.last_index > after_index)

    async def wait_until(self, predicate: Callable[[State], bool]) -> State:
        """The state, once `predicate(state)` holds (checked now and after each change)."""
        while not predicate(self._state):
            await self._changed.wait()
        return self._state

    def statistics(self) -> StateViewStatistics:
        return StateViewStatistics(
            session=self.session,
            last_index=self._state.last_index,
            events_applied=self._events_applied,
            duplicates_dropped=self._buffer.duplicates,
            pending=self._buffer.pending,
            overflowed=self._buffer.overflowed,
            replay_requests=self._replay_requests,
            snapshots_applied=self._snapshots_applied,
            foreign_dropped=self._foreign_dropped,
            payloads_dropped=self._payloads_dropped,
        )

    async def run(
        self, *, task_status: trio.TaskStatus[StateView] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Follow the session until cancelled; `started(self)` once subscribed."""
        with self.router.subscribe(Topic.GLOBAL_EVENTS) as events:
            task_status.started(self)
            await self._request_replay()
            while True:
                with trio.move_on_at(self._replay_deadline):
                    self._receive(await events.receive())
                    await self._after_change()
                    continue
                await self._replay_timed_out()

    # --- receiving --------------------------------------------------------------------------

    def _receive(self, envelope: Envelope) -> None:
        item = envelope.payload
        if envelope.sender != self.session.master_id:
            # Only the session's master speaks for the log: a peer's forged event (or a
            # snapshot far ahead, which would freeze this view) is no event of the session.
            self._payloads_dropped += 1
            log.warning(
                "state view dropped a %s on global_events from %s: not the master %s",
                type(item).__name__,
                envelope.sender,
                self.session.master_id,
            )
            return
        if not isinstance(item, IndexedEvent | StateSnapshot):
            self._payloads_dropped += 1
            log.warning(
                "state view dropped a %s payload on global_events from %s",
                type(item).__name__,
                envelope.sender,
            )
            return
        if item.session != self.session:
            self._foreign_dropped += 1
            log.debug("state view of %s dropped an item of %s", self.session, item.session)
            return
        if isinstance(item, StateSnapshot):
            self._take_snapshot(item)
            return
        ready = self._buffer.offer(item)
        if ready:
            self._apply(self._state, ready)

    def _take_snapshot(self, snapshot: StateSnapshot) -> None:
        if snapshot.index < self._buffer.next_index:
            return  # this view is there already
        self._snapshots_applied += 1
        log.info(
            "state view of %s caught up from a snapshot at %d (was at %d)",
            self.session,
            snapshot.index,
            self._state.last_index,
        )
        ready = self._buffer.skip_to(snapshot.index + 1)
        self._apply(attrs.evolve(snapshot.state, last_index=snapshot.index), ready)
        trace(self.router.node_id, "snapshot_applied", index=snapshot.index)

    def _apply(self, state: State, events: list[IndexedEvent]) -> None:
        for event in events:
            state = apply(state, event)
        self._state = state
        self._events_applied += len(events)
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # --- gap repair -------------------------------------------------------------------------

    @property
    def _needs_replay(self) -> bool:
        # Nothing applied yet may mean our first request was lost: keep asking until the
        # session's first event arrives.
        return self._buffer.has_gap or self._state.last_index < 0

    async def _after_change(self) -> None:
        outstanding = self._replay_deadline < math.inf
        if outstanding and not self._needs_replay:
            self._replay_deadline = math.inf
            if not self._caught_up:  # the first replay is in: a joiner's catch-up is done
                self._caught_up = True
                trace(self.router.node_id, "view_caught_up", index=self._state.last_index)
        elif not outstanding and self._buffer.has_gap:
            await self._request_replay()

    async def _replay_timed_out(self) -> None:
        self._replay_deadline = math.inf
        if self._needs_replay:
            await self._request_replay()

    async def _request_replay(self) -> None:
        from_index = self._buffer.next_index
        self._replay_requests += 1
        self._replay_deadline = trio.current_time() + self.config.replay_retry
        request = RequestReplay(command_id=new_id(), from_index=from_index)
        log.debug("state view of %s asks for a replay from %d", self.session, from_index)
        try:
            await self.router.send(self.session.master_id, Topic.COMMANDS, request)
        except PeerUnreachable:
            log.info("state view cannot reach master %s yet; will retry", self.session.master_id)
