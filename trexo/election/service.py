"""The election service: a thin trio shell around `ElectionCore` (README, Architecture).

One loop owns the core. It takes election messages and membership changes from one input
channel (or the core's timer when its deadline comes), feeds them to the core with
`trio.current_time()`, and carries out what the core returns, in order: persist the clock,
log, send, and hand a newly decided session to the session supervisor.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

from trexo.config import ElectionConfig
from trexo.election.clock_store import load_clock, store_clock
from trexo.election.core import ElectionCore, ElectionStatistics
from trexo.election.outputs import (
    Adopted,
    CampaignStarted,
    Decided,
    Dropped,
    Ignored,
    Note,
    Outputs,
)
from trexo.net.router import Envelope, PeerUnreachable, Router
from trexo.net.topics import Topic
from trexo.types.ids import NodeId
from trexo.types.session import Session

log = logging.getLogger(__name__)


def _no_commands() -> int:
    return 0


@attrs.frozen
class _PeersChanged:
    peers: frozenset[NodeId]


_Input = Envelope | _PeersChanged


class Election:
    """Decides the session and sends each new one on `sessions` (closed when `run` ends).

    `commands_seen` is how many commands this node's master has handled (ties between equal
    clock and seniority go to the node that has seen more); `force_master` gives this node a
    seniority no other node reaches, so it wins every round it takes part in.
    """

    def __init__(
        self,
        router: Router,
        data_dir: Path,
        sessions: trio.MemorySendChannel[Session],
        *,
        config: ElectionConfig | None = None,
        commands_seen: Callable[[], int] = _no_commands,
        force_master: bool = False,
    ) -> None:
        self._router = router
        self._data_dir = data_dir
        self._sessions = sessions
        self._config = config if config is not None else ElectionConfig()
        self._commands_seen = commands_seen
        self._force_master = force_master
        self.node_id: NodeId = router.node_id
        self._core: ElectionCore | None = None

    @property
    def session(self) -> Session | None:
        """The current session (None until the first is decided)."""
        return self._core.session if self._core is not None else None

    def statistics(self) -> ElectionStatistics:
        """Session, clock, rounds taken part in and the last decision's latency."""
        if self._core is None:
            return ElectionStatistics(
                session=None,
                clock=0,
                seniority=0,
                campaigning=None,
                rounds=0,
                decisions=0,
                adoptions=0,
                last_decision_latency=None,
            )
        return self._core.statistics()

    async def run(
        self, *, task_status: trio.TaskStatus[Election] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with self._sessions:
            # The clock file is a few bytes, read once and written once per round: inline,
            # since a thread hop costs more (and would let a MockClock skip past deadlines).
            core = ElectionCore(
                self.node_id,
                clock=load_clock(self._data_dir, max_clock=self._config.max_clock),
                config=self._config,
                commands_seen=self._commands_seen,
                force_master=self._force_master,
            )
            self._core = core
            inputs_send, inputs_receive = trio.open_memory_channel[_Input](math.inf)
            with self._router.subscribe(Topic.ELECTION) as inbox, inputs_receive:
                async with trio.open_nursery() as nursery:
                    # Subscribed and watching before `start` asks the peers to answer.
                    peers = self._router.peers
                    nursery.start_soon(self._forward_inbox, inbox, inputs_send.clone())
                    nursery.start_soon(self._watch_peers, peers, inputs_send.clone())
                    inputs_send.close()
                    log.info("election starting at clock %d, peers %s", core.clock, sorted(peers))
                    await self._carry_out(core.start(trio.current_time(), peers))
                    task_status.started(self)
                    await self._serve(core, inputs_receive)

    async def _serve(self, core: ElectionCore, inputs: trio.MemoryReceiveChannel[_Input]) -> None:
        while True:
            item: _Input | None = None
            deadline = core.deadline
            with trio.move_on_at(math.inf if deadline is None else deadline):
                item = await inputs.receive()
            now = trio.current_time()
            if item is None:
                outputs = core.timer(now)
            elif isinstance(item, _PeersChanged):
                outputs = core.peers_changed(now, item.peers)
            else:
                outputs = core.receive(now, item.sender, item.payload)
            await self._carry_out(outputs)

    async def _forward_inbox(
        self,
        inbox: trio.MemoryReceiveChannel[Envelope],
        inputs: trio.MemorySendChannel[_Input],
    ) -> None:
        async with inputs:
            async for envelope in inbox:
                await inputs.send(envelope)

    async def _watch_peers(
        self, peers: frozenset[NodeId], inputs: trio.MemorySendChannel[_Input]
    ) -> None:
        async with inputs:
            while True:
                peers = await self._router.wait_peers_change(peers)
                await inputs.send(_PeersChanged(peers))

    async def _carry_out(self, outputs: Outputs) -> None:
        if outputs.clock is not None:
            # Before anything carries the new clock off this node.
            store_clock(self._data_dir, outputs.clock, max_clock=self._config.max_clock)
        for note in outputs.notes:
            self._log_note(note)
        for outgoing in outputs.messages:
            if outgoing.to is None:
                await self._router.publish(Topic.ELECTION, outgoing.message)
                continue
            try:
                await self._router.send(outgoing.to, Topic.ELECTION, outgoing.message)
            except PeerUnreachable:
                log.debug("%s left before our election message reached it", outgoing.to)
        if outputs.session is not None:
            await self._sessions.send(outputs.session)

    def _log_note(self, note: Note) -> None:
        match note:
            case CampaignStarted(clock=clock, reason=reason, origin=origin):
                if origin == self.node_id:
                    log.info("campaign for clock %d (%s)", clock, reason.value)
                else:
                    log.info("joining the campaign for clock %d (from %s)", clock, origin)
            case Decided(session=session, participants=participants, latency=latency):
                log.info(
                    "session %d: master is %s (decided among %d candidates in %.1f ms)",
                    session.clock,
                    session.master_id,
                    participants,
                    latency * 1000,
                )
            case Adopted(session=session, source=source, latency=latency):
                after = "" if latency is None else f", {latency * 1000:.1f} ms into the campaign"
                log.info(
                    "session %d: master is %s (adopted from %s%s)",
                    session.clock,
                    session.master_id,
                    source,
                    after,
                )
            case Dropped(sender=sender, message=message, reason=reason):
                log.warning("dropped election message from %s: %s: %r", sender, reason, message)
            case Ignored(sender=sender, message=message, reason=reason):
                log.debug("ignored election message from %s: %s: %r", sender, reason, message)
