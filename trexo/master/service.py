"""The master: turns commands and local events into the session's ordered, durable event log.

Shell around the pure parts (`decide`, `placement`, `trexo.state.apply`): one task handles
every message in arrival order, so validation always sees the state that the events emitted
so far produce, and indices are handed out without locks. Each event is appended to the log
on disk, then broadcast on `global_events`.

Bounded history: the master keeps only its newest snapshot and the events after it
(`trexo.master.history`); every `snapshot_every_events` events (or at the first event
`snapshot_every_s` after the last snapshot) it snapshots the state, rolls its log on disk
there and deletes what the snapshot covers (`trexo.master.session_store`). A replay from
before the snapshot is answered with the snapshot, then the events after it. Older
sessions' files are pruned to the retention once, when the master starts.

Starting: if the session's log already exists (the generation restarted within the same
session), the master resumes from its newest snapshot and the events after it. Otherwise,
if given an initial state (what the previous session ended with), the master's first
events rebuild the part of it a new session keeps (`trexo.state.carry_over`), so that the
new session's log alone brings a late joiner to the same state.
"""

from __future__ import annotations

import logging
import typing
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio

from trexo import thread_pools
from trexo.config import EVENT_LOG_OPEN_ATTEMPTS, EVENT_LOG_OPEN_RETRY_S, MasterConfig
from trexo.fd_limit import retry_on_fd_exhaustion
from trexo.idempotency import KEY_REUSED_MESSAGE, command_fingerprint
from trexo.master.authority import command_refusal, fact_refusal
from trexo.master.decide import (
    Accepted,
    Decision,
    Refused,
    StateCommand,
    decide_command,
    decide_local_event,
    decide_nodes_lost,
    orphaned_tasks,
)
from trexo.master.event_log import EventLog, open_event_log
from trexo.master.history import History, SnapshotPolicy
from trexo.master.session_store import (
    StoredSession,
    disk_bytes,
    drop_superseded,
    install_snapshot,
    prune_sessions,
    read_session,
    segment_path,
    session_dir,
    snapshot_path,
    write_temporary_snapshot,
)
from trexo.net.router import Envelope, PeerUnreachable, Router
from trexo.net.topics import Topic
from trexo.state import apply, apply_all, carry_over, rebuild_events
from trexo.trace import trace
from trexo.types.commands import Command, RequestReplay, SubmitTask
from trexo.types.events import Event, IndexedEvent, InstanceCreated, SessionOpened
from trexo.types.ids import NodeId, new_id
from trexo.types.local_events import LocalEvent
from trexo.types.refusal import RefusalKind
from trexo.types.session import Session
from trexo.types.snapshot import StateSnapshot
from trexo.types.state import State
from trexo.types.stream import CommandReply, StreamFailed

log = logging.getLogger(__name__)


@attrs.frozen
class _PeersChanged:
    """Internal: the router's set of linked peers is now `peers`."""

    peers: frozenset[NodeId]


_COMMAND_TYPES = typing.get_args(Command)
_LOCAL_EVENT_TYPES = typing.get_args(LocalEvent)


@attrs.frozen
class MasterStatistics:
    """A snapshot of a `Master`, in the style of trio's `statistics()` objects."""

    session: Session
    events_emitted: int
    """Events in this session's log (resumed ones included); also the next index."""
    events_in_memory: int
    """Events kept for replays: those after the last snapshot."""
    snapshot_index: int | None
    """The index the last snapshot stands at (None: none yet)."""
    snapshots_taken: int
    log_bytes: int
    """This session's log on disk: its snapshot and the segment after it."""
    retained_log_bytes: int
    """Older sessions' logs still on disk (pruned to the retention)."""
    commands_handled: int
    commands_refused: int
    local_events_handled: int
    replays_served: int
    payloads_dropped: int
    """Messages of the wrong type on the master's topics, and facts a node may not report
    (about another node, its runners or its tasks)."""


class Master:
    """The master of one session. `await nursery.start(master.run)`; cancel to stop."""

    def __init__(
        self,
        router: Router,
        session: Session,
        log_dir: Path,
        initial_state: State | None = None,
        *,
        config: MasterConfig | None = None,
        id_factory: Callable[[], str] = new_id,
    ) -> None:
        self.router = router
        self.session = session
        self.events_dir = log_dir
        self.log_dir = session_dir(log_dir, session)
        self.config = config or MasterConfig()
        self._initial_state = initial_state or State()
        self._new_id = id_factory
        self._state = State()
        self._history = History(session)
        self._policy = SnapshotPolicy(
            self.config.snapshot_every_events, self.config.snapshot_every_s
        )
        self._last_snapshot_at = 0.0
        self._snapshots_taken = 0
        self._snapshot_bytes = 0
        self._retained_bytes = 0
        self._log: EventLog | None = None
        self._commands_handled = 0
        self._replies: dict[str, tuple[str | None, CommandReply]] = {}
        """Each command's reply, with what it asked for (`command_fingerprint`)."""
        self._commands_refused = 0
        self._local_events_handled = 0
        self._replays_served = 0
        self._payloads_dropped = 0

    @property
    def state(self) -> State:
        """The state the events emitted so far produce."""
        return self._state

    @property
    def commands_seen(self) -> int:
        """Commands of any kind this master has handled (the election ranks by it)."""
        return self._commands_handled

    def statistics(self) -> MasterStatistics:
        snapshot = self._history.snapshot
        segment = self._log.statistics().segment_bytes if self._log is not None else 0
        return MasterStatistics(
            session=self.session,
            events_emitted=self._history.next_index,
            events_in_memory=self._history.events_in_memory,
            snapshot_index=snapshot.index if snapshot is not None else None,
            snapshots_taken=self._snapshots_taken,
            log_bytes=self._snapshot_bytes + segment,
            retained_log_bytes=self._retained_bytes,
            commands_handled=self._commands_handled,
            commands_refused=self._commands_refused,
            local_events_handled=self._local_events_handled,
            replays_served=self._replays_served,
            payloads_dropped=self._payloads_dropped,
        )

    async def run(self, *, task_status: trio.TaskStatus[Master] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the session until cancelled; `started(self)` once subscribed and caught up."""
        with (
            self.router.subscribe(Topic.COMMANDS) as commands,
            self.router.subscribe(Topic.LOCAL_EVENTS) as local_events,
        ):
            resumed = await self._resume()
            self._last_snapshot_at = trio.current_time()
            first_segment = segment_path(self.log_dir, self._history.next_index)
            async with (
                open_event_log(first_segment, fsync_interval=self.config.fsync_interval) as ev_log,
                trio.open_nursery() as nursery,
            ):
                self._log = ev_log
                if not resumed:
                    await self._open_session()
                    trace(self.router.node_id, "master_opened", clock=self.session.clock)
                # Housekeeping, off the path that brings the cluster its new master.
                nursery.start_soon(self._prune_old_sessions)
                # Both topics feed one handler, so messages are handled strictly one by one.
                inbox_send, inbox = trio.open_memory_channel[Envelope](0)
                async with inbox_send:
                    nursery.start_soon(_forward, commands, inbox_send.clone())
                    nursery.start_soon(_forward, local_events, inbox_send.clone())
                    nursery.start_soon(self._watch_peers, inbox_send.clone())
                task_status.started(self)
                async with inbox:
                    async for envelope in inbox:
                        await self._handle(envelope)

    async def _resume(self) -> bool:
        """Load this session's existing log, if any; whether it held anything."""
        self._state, self._history = State(), History(self.session)
        if not self.log_dir.exists():
            # A session this node has not been master of: nothing to read. (A stat, inline:
            # the thread hop it saves is on the path of every failover.)
            return False
        stored: StoredSession = await retry_on_fd_exhaustion(
            partial(read_session, self.log_dir, self.session),
            what=f"reading event log {self.log_dir}",
            attempts=EVENT_LOG_OPEN_ATTEMPTS,
            interval=EVENT_LOG_OPEN_RETRY_S,
            limiter=thread_pools.limiter("event_log"),
        )
        if stored.snapshot is None and not stored.events:
            return False
        self._history = History(self.session, stored.snapshot)
        self._state = stored.snapshot.state if stored.snapshot is not None else State()
        for event in stored.events:
            self._history.append(event)
            self._state = apply(self._state, event)
        if stored.snapshot is not None:
            self._snapshot_bytes = await thread_pools.run_sync(
                "event_log", disk_bytes, snapshot_path(self.log_dir, stored.snapshot.index)
            )
        log.info(
            "master %s resumed from %s and %d logged events after it",
            self.session,
            f"the snapshot at {stored.snapshot.index}" if stored.snapshot else "the start",
            len(stored.events),
        )
        return True

    # --- handling ---------------------------------------------------------------------------

    async def _watch_peers(self, inbox: trio.MemorySendChannel[Envelope]) -> None:
        """Turn membership changes into messages for the handler (a node left: clean up)."""
        async with inbox:
            peers = self.router.peers
            while True:
                await inbox.send(
                    Envelope(Topic.LOCAL_EVENTS, self.router.node_id, _PeersChanged(peers))
                )
                peers = await self.router.wait_peers_change(peers)

    async def _open_session(self) -> None:
        """The session's first events, in one write: the state carried over, then what ran
        on nodes that are gone (before workers act on the state), then `SessionOpened`."""
        carried = rebuild_events(carry_over(self._initial_state))
        lost = await self._nodes_lost(apply_all(State(), carried), self.router.peers)
        await self._emit_all([*carried, *lost, SessionOpened()])

    async def _handle_peers(self, peers: frozenset[NodeId]) -> None:
        await self._emit_all(await self._nodes_lost(self._state, peers))

    async def _nodes_lost(self, state: State, peers: frozenset[NodeId]) -> list[Event]:
        """The events for the nodes of `state` that are not among `peers` (nor this node);
        the requesters of generations those take with them are told first."""
        events = decide_nodes_lost(
            state,
            peers | {self.router.node_id},
            new_id=self._new_id,
            overhead=self.config.memory_overhead,
        )
        if not events:
            return []
        for task in orphaned_tasks(state, events):
            failed = StreamFailed(task.task_id, "the node running this generation left the cluster")
            await self._send(task.origin_node, Topic.STREAM, failed)
        replaced = sum(isinstance(e, InstanceCreated) for e in events)
        log.info(
            "nodes left the cluster: %d events, %d instances placed again", len(events), replaced
        )
        return events

    async def _handle(self, envelope: Envelope) -> None:
        payload: Any = envelope.payload
        if isinstance(payload, _PeersChanged):
            await self._handle_peers(payload.peers)
        elif envelope.topic is Topic.COMMANDS and isinstance(payload, _COMMAND_TYPES):
            await self._handle_command(envelope.sender, payload)
        elif envelope.topic is Topic.LOCAL_EVENTS and isinstance(payload, _LOCAL_EVENT_TYPES):
            await self._handle_local_event(envelope.sender, payload)
        else:
            self._payloads_dropped += 1
            log.warning(
                "master dropped a %s payload on %s from %s",
                type(payload).__name__,
                envelope.topic.value,
                envelope.sender,
            )

    async def _handle_command(self, sender: NodeId, command: Command) -> None:
        # Senders resend until they hear back (a command may reach a master that is still
        # starting), so a command is decided once and its reply repeated for any resend.
        # A reply is repeated only to the same request: an idempotency key reused for
        # another is refused (the state's record of what was done says the same).
        fingerprint = command_fingerprint(command)
        if (earlier := self._replies.get(command.command_id)) is not None:
            asked, reply = earlier
            if asked != fingerprint:
                reply = CommandReply(command.command_id, KEY_REUSED_MESSAGE, RefusalKind.KEY_REUSED)
            await self._send(sender, Topic.STREAM, reply)
            return
        self._commands_handled += 1
        if (refusal := command_refusal(self._state, sender, command)) is not None:
            decision: Decision = Refused(refusal, RefusalKind.INVALID)
        elif isinstance(command, RequestReplay):
            decision = await self._replay(sender, command)
        else:
            decision = self._decide(command)
            if isinstance(decision, Accepted):
                for event in decision.events:
                    await self._emit(event)
        if isinstance(decision, Refused):
            self._commands_refused += 1
            log.info("refused %s from %s: %s", type(command).__name__, sender, decision.error)
            reply = CommandReply(command.command_id, decision.error, decision.kind)
        else:
            log.debug("accepted %s from %s: %s", type(command).__name__, sender, decision.result_id)
            reply = CommandReply(
                command.command_id,
                result_id=decision.result_id,
                lead_node=self._lead_node(command) if isinstance(command, SubmitTask) else None,
            )
        if not isinstance(command, RequestReplay):
            self._remember(fingerprint, reply)
        await self._send(sender, Topic.STREAM, reply)

    def _lead_node(self, command: SubmitTask) -> NodeId | None:
        """Where the task just created runs: its origin sends the request body there."""
        task = self._state.tasks.get(command.request_id)
        instance = self._state.instances.get(task.instance_id) if task is not None else None
        return instance.lead.node_id if instance is not None else None

    def _remember(self, fingerprint: str | None, reply: CommandReply) -> None:
        self._replies[reply.command_id] = (fingerprint, reply)
        while len(self._replies) > self.config.remembered_replies:
            del self._replies[next(iter(self._replies))]  # the oldest (dicts keep order)

    def _decide(self, command: StateCommand) -> Decision:
        return decide_command(
            self._state, command, new_id=self._new_id, overhead=self.config.memory_overhead
        )

    async def _replay(self, sender: NodeId, command: RequestReplay) -> Decision:
        if command.from_index < 0:
            return Refused(f"replay from negative index {command.from_index}", RefusalKind.INVALID)
        self._replays_served += 1
        replay = self._history.replay(command.from_index)
        items: list[StateSnapshot | IndexedEvent] = list(replay.events)
        if replay.snapshot is not None:
            items.insert(0, replay.snapshot)
        if command.from_index == 0 and len(items) > 1:
            # A view starting from nothing gets the state at the head in one message: applied
            # item by item it would show an old part of the session as the current state
            # (placements since deleted, none of the newer ones) and, were its node elected
            # next, carry that part over.
            items = [StateSnapshot(self.session, self._history.next_index - 1, self._state)]
        for item in items:
            if not await self._send(sender, Topic.GLOBAL_EVENTS, item):
                break
        return Accepted((), None)

    async def _handle_local_event(self, sender: NodeId, local_event: LocalEvent) -> None:
        self._local_events_handled += 1
        if (refusal := fact_refusal(self._state, sender, local_event)) is not None:
            self._payloads_dropped += 1
            log.warning(
                "master dropped a %s on local_events from %s: %s",
                type(local_event).__name__,
                sender,
                refusal,
            )
            return
        for event in decide_local_event(self._state, local_event):
            await self._emit(event)

    # --- emitting ---------------------------------------------------------------------------

    async def _emit(self, event: Event) -> IndexedEvent:
        """Give `event` the next index, log it, apply it, then broadcast it."""
        (indexed,) = await self._emit_all([event])
        return indexed

    async def _emit_all(self, events: Sequence[Event]) -> list[IndexedEvent]:
        """`_emit` for several events at once: logged in one write, then each broadcast."""
        if not events:
            return []
        assert self._log is not None, "emit before the log is open"
        first = self._history.next_index
        indexed = [IndexedEvent(self.session, first + i, e) for i, e in enumerate(events)]
        await self._log.append_all(indexed)  # in the log before anyone hears of it
        for one in indexed:
            self._history.append(one)
            self._state = apply(self._state, one)
            await self.router.publish(Topic.GLOBAL_EVENTS, one)
        if self._policy.due(
            self._history.events_in_memory, trio.current_time() - self._last_snapshot_at
        ):
            await self._snapshot()
        return indexed

    async def _snapshot(self) -> None:
        """Snapshot the state, roll the log there, and delete what the snapshot covers.

        The snapshot is durable before the log rolls and anything is deleted, so a crash at
        any step leaves the previous snapshot or this one, each with every event after it.
        A disk error keeps the previous files (the log goes on in the old segment) and is
        retried at the next snapshot; memory is bounded either way.
        """
        assert self._log is not None
        snapshot = self._history.take_snapshot(self._state)
        self._last_snapshot_at = trio.current_time()
        try:
            temporary = await thread_pools.run_sync(
                "event_log", write_temporary_snapshot, self.log_dir, snapshot
            )
            if self.config.test_snapshot_pause:
                await trio.sleep(self.config.test_snapshot_pause)
            path = await thread_pools.run_sync("event_log", install_snapshot, temporary)
            await self._log.roll(segment_path(self.log_dir, snapshot.index + 1))
            self._snapshot_bytes = await thread_pools.run_sync("event_log", disk_bytes, path)
            await thread_pools.run_sync("event_log", drop_superseded, self.log_dir, snapshot.index)
        except OSError as exc:
            log.warning("master %s: could not write a snapshot (%s)", self.session, exc)
            return
        self._snapshots_taken += 1
        log.debug("master %s: snapshot at %d", self.session, snapshot.index)

    async def _prune_old_sessions(self) -> None:
        """Once, at start: older sessions' files do not grow while this one runs."""
        config = self.config
        try:
            await thread_pools.run_sync(
                "event_log",
                partial(
                    prune_sessions,
                    self.events_dir,
                    self.session,
                    keep_sessions=config.retained_sessions,
                    max_bytes=config.retained_log_bytes,
                ),
            )
            self._retained_bytes = await thread_pools.run_sync(
                "event_log", disk_bytes, self.events_dir
            ) - await thread_pools.run_sync("event_log", disk_bytes, self.log_dir)
        except OSError as exc:
            log.warning("master %s: could not prune old sessions (%s)", self.session, exc)

    async def _send(self, node_id: NodeId, topic: Topic, payload: object) -> bool:
        """Point-to-point send; a node that has gone is ordinary (logged, False)."""
        try:
            await self.router.send(node_id, topic, payload)
        except PeerUnreachable:
            log.info("master could not reach %s for a %s message", node_id, topic.value)
            return False
        return True


async def _forward(
    receive: trio.MemoryReceiveChannel[Envelope], send: trio.MemorySendChannel[Envelope]
) -> None:
    async with send:
        async for envelope in receive:
            await send.send(envelope)
