"""The worker: this node's part of one session.

It re-plans (`trexo.worker.plan`) on every state change and every change in the node's
`RunnerPool`, and has the pool carry the actions out: start or stop runners, forward or
cancel tasks. It reports the pool's facts and the node's memory to the session's master.
It is session-scoped but owns no process and no stream: the pool does, for the node's whole
life, so a session swap keeps models loaded and generations streaming. Nothing it does
blocks its exit (README, Architecture).
"""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import Awaitable, Callable

import psutil
import trio

from trexo import thread_pools
from trexo.config import NODE_REPORT_INTERVAL_S, NODE_REREPORT_DELAY_S
from trexo.hub.downloads import Downloads
from trexo.net.router import PeerUnreachable, Router
from trexo.net.topics import Topic
from trexo.types.ids import NodeId, RequestId
from trexo.types.local_events import LocalEvent, NodeReport, TaskReport
from trexo.types.session import Session
from trexo.types.state import NodeInfo, State
from trexo.worker.plan import (
    CancelTask,
    ForwardTask,
    LocalWorld,
    StartRunner,
    StopRunner,
    UpdateGroup,
    plan,
)
from trexo.worker.runner_pool import RunnerPool
from trexo.worker.state_view import StateView

log = logging.getLogger(__name__)


def read_node_info(
    node_id: NodeId, api_url: str | None, peers: frozenset[NodeId] = frozenset()
) -> NodeInfo:
    memory = psutil.virtual_memory()
    return NodeInfo(
        node_id,
        socket.gethostname(),
        memory.total,
        memory.available,
        api_url,
        tuple(sorted(peers)),
    )


class Worker:
    def __init__(
        self,
        *,
        router: Router,
        session: Session,
        view: StateView,
        pool: RunnerPool,
        downloads: Downloads | None = None,
        api_url: Callable[[], str | None] = lambda: None,
        node_report_interval: float = NODE_REPORT_INTERVAL_S,
    ) -> None:
        self._router = router
        self.node_id = router.node_id
        self._session = session
        self._view = view
        self._pool = pool
        self._downloads = downloads
        self._api_url = api_url
        self._node_report_interval = node_report_interval
        self._local_changed = trio.Event()
        self._seen_index = -1
        self._known: set[RequestId] = set()
        """Tasks this session's state has listed: only those are cancelled when they leave it
        (a task the new master has not adopted yet is not a cancelled one)."""
        self._reports_send, self._reports_receive = trio.open_memory_channel[LocalEvent](math.inf)

    async def run(self, *, task_status: trio.TaskStatus[Worker] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            # What the runners did while there was no master, and what they do now.
            for fact in self._facts_now():
                self._report(fact)
            nursery.start_soon(self._send_reports)
            nursery.start_soon(self._send_facts, self._pool.facts)
            if self._downloads is not None:
                nursery.start_soon(self._send_facts, self._downloads.facts)
            nursery.start_soon(self._report_node_periodically)
            nursery.start_soon(self._wake_on, self._wait_state_change)
            nursery.start_soon(self._wake_on, self._pool.wait_change)
            task_status.started(self)
            await self._plan_loop()

    # --- planning -------------------------------------------------------------------------

    def _local_world(self) -> LocalWorld:
        pool = self._pool
        inflight = frozenset(pool.inflight)
        return LocalWorld(
            node_id=self.node_id,
            runners=frozenset(pool.runners),
            taken=inflight | frozenset(pool.finished),
            inflight=inflight,
            cancelling=pool.cancelling,
            known=frozenset(self._known),
            groups=pool.groups,
            bring_ups=pool.bring_ups,
            bodies=pool.bodies.held_from,
        )

    async def _wait_state_change(self) -> None:
        self._seen_index = (await self._view.wait_state_change(self._seen_index)).last_index

    async def _wake_on(self, wait: Callable[[], Awaitable[object]]) -> None:
        while True:
            await wait()
            self._local_changed.set()
            await trio.lowlevel.checkpoint()  # a wait that returns at once must not spin

    async def _plan_loop(self) -> None:
        reported_finished = False
        while True:
            self._local_changed = trio.Event()
            state = self._view.state
            if state.opened:  # the carried-over state is in: act on it
                if not reported_finished:
                    self._report_finished_again(state)
                    reported_finished = True
                self._pool.forget_finished(set(state.tasks))
                self._pool.bodies.expire(trio.current_time(), keep=state.tasks.keys())
                self._known = (self._known | state.tasks.keys()) & (
                    state.tasks.keys() | self._pool.inflight.keys()
                )
                for action in plan(state, self._local_world()):
                    self._execute(action)
            await self._local_changed.wait()

    def _report_finished_again(self, state: State) -> None:
        """Tasks this node finished whose end the previous master never recorded."""
        for task_id, reason in self._pool.finished.items():
            if task_id in state.tasks:
                self._report(TaskReport(task_id, finish_reason=reason))

    def _execute(self, action: object) -> None:
        match action:
            case StartRunner(instance=instance, assignment=assignment):
                self._pool.start(instance, assignment)
            case StopRunner(runner_id=runner_id):
                self._pool.stop(runner_id)
            case UpdateGroup(runner_id=runner_id, group=group, bring_up=bring_up):
                self._pool.update_group(runner_id, group, bring_up)
            case ForwardTask(task=task, runner_id=runner_id):
                self._pool.forward(task, runner_id)
            case CancelTask(task_id=task_id):
                self._pool.cancel(task_id)

    # --- reports to the master ------------------------------------------------------------

    def _report(self, event: LocalEvent) -> None:
        self._reports_send.send_nowait(event)

    async def _send_reports(self) -> None:
        async for event in self._reports_receive:
            await self._send(event)

    async def _send_facts(self, facts: trio.MemoryReceiveChannel[LocalEvent]) -> None:
        # The pool's and the downloads' channels outlive this worker: what we do not take,
        # the next one sends.
        async for event in facts:
            await self._send(event)

    def _facts_now(self) -> list[LocalEvent]:
        facts = self._pool.facts_now()
        if self._downloads is not None:
            facts += self._downloads.facts_now()
        return facts

    async def _send(self, event: LocalEvent) -> None:
        try:
            await self._router.send(self._session.master_id, Topic.LOCAL_EVENTS, event)
        except PeerUnreachable:
            log.debug("master unreachable; dropped %s", type(event).__name__)

    async def _report_node_periodically(self) -> None:
        """Report this node's memory and its runners' statuses, again every interval, and
        again soon while the session's state does not list this node.

        Repeats cost nothing (the master emits events only for changes) and repair a report
        lost in transit, e.g. on a link that was replaced while two nodes first met, or one
        that reached the new master of a merge before its generation listened (the state it
        carried over had dropped this node while the two sides were apart).
        """
        while True:
            peers = self._router.peers
            try:
                info = await thread_pools.run_sync(
                    "files",
                    read_node_info,
                    self.node_id,
                    self._api_url(),
                    peers,
                    abandon_on_cancel=True,
                )
            except OSError as exc:  # e.g. EMFILE: no descriptor left to read /proc/meminfo
                log.warning(
                    "could not read this node's memory figures (%s); trying again in %g s",
                    exc,
                    self._node_report_interval,
                )
            else:
                self._report(NodeReport(info))
            for fact in self._facts_now():
                self._report(fact)
            await self._wait_next_node_report(peers)

    async def _wait_next_node_report(self, peers: frozenset[NodeId]) -> None:
        """Until the next report is due: the interval, a change of this node's links (the
        state lists them, so a picture of the cluster shows a new link at once), or a short
        pause while the opened state lacks this node (its last report was lost)."""
        with trio.move_on_after(self._node_report_interval) as due:
            async with trio.open_nursery() as nursery:

                async def links_changed() -> None:
                    await self._router.wait_peers_change(peers)
                    due.cancel()

                nursery.start_soon(links_changed)
                await self._wait_report_lost()
                due.cancel()

    async def _wait_report_lost(self) -> None:
        """Until the opened state has lacked this node for a short pause."""
        seen = self._view.state.last_index
        while True:
            state = self._view.state
            if state.opened and self.node_id not in state.nodes:
                await trio.sleep(NODE_REREPORT_DELAY_S)
                return
            seen = (await self._view.wait_state_change(seen)).last_index
