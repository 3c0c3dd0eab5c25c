"""The node: wires the services together (README, Architecture).

Node (root nursery)               lives as long as the process
├─ StreamHub                      chunks and command replies for this node
├─ ApiServer                      node-lifetime: stays up across sessions
├─ SessionSupervisor              one generation per session
│   └─ generation: Master (if this node won), StateView, Worker (-> runners)
├─ Election                       decides sessions
└─ DefaultModel                   places the default model once per session, if asked
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import Any

import attrs
import trio

from trexo import catalog, thread_pools
from trexo.api.app import create_app
from trexo.api.server import ApiServer
from trexo.catalog_scan import CatalogScan
from trexo.cluster_client import ClusterClient, SessionTracker
from trexo.config import NodeConfig
from trexo.default_model import DefaultModel
from trexo.election import Election
from trexo.hub.downloads import Downloads
from trexo.hub.resolve import resolve_model
from trexo.identity import load_or_create_node_id
from trexo.lifecycle import SessionSupervisor
from trexo.master.service import Master
from trexo.master.session_store import read_newest_session
from trexo.net.discovery import Discovery
from trexo.net.router import Router
from trexo.net.stream_hub import StreamHub
from trexo.net.transport import Transport
from trexo.peer_port_file import write_peer_port
from trexo.prompt_counter import PromptCounter
from trexo.state import after_restart
from trexo.trace import trace, tracing
from trexo.types.ids import InstanceId, NodeId
from trexo.types.models import ModelRef
from trexo.types.session import Session
from trexo.worker.runner_pool import RunnerPool
from trexo.worker.service import Worker
from trexo.worker.state_view import StateView

log = logging.getLogger(__name__)


@attrs.frozen
class NodeStarted:
    node_id: NodeId
    api_url: str
    ollama_url: str | None = None
    """The API's second listener, for Ollama clients (`ApiConfig.ollama_port`)."""


ReadyCallback = Callable[[ModelRef, InstanceId, str], None]
"""Told the model, its instance and the API URL once the default model answers."""
FailedCallback = Callable[[ModelRef, str, str], None]
"""Told the model, why, and the API URL if the default model failed to load for good."""


class Node:
    def __init__(
        self,
        config: NodeConfig,
        *,
        on_model_ready: ReadyCallback | None = None,
        on_model_failed: FailedCallback | None = None,
    ) -> None:
        self.config = config
        self._on_model_ready = on_model_ready
        self._on_model_failed = on_model_failed
        self.node_id = load_or_create_node_id(config.paths.data_dir)
        self.router = Router(self.node_id)
        self.sessions = SessionTracker()
        self.hub = StreamHub(self.router, master=self._master_id)
        self.prompt_counter = PromptCounter(config.paths.models_dir, config.hub.cache_dir)
        self.catalog_scan = CatalogScan(
            config.hub.cache_dir,
            config.paths.models_dir,
            config.extra_models,
            max_json_bytes=config.hub.max_json_bytes,
            downloads_changed=lambda: self.downloads.wait_change(),
        )
        self.client = ClusterClient(
            self.router,
            self.hub,
            self.sessions,
            self._catalog,
            prompt_counter=self.prompt_counter,
            resolve_hub_model=functools.partial(resolve_model, config=config.hub),
            on_disk=self.catalog_scan.on_disk,
            prompt_caches=lambda: self.pool.prompt_caches(),
            history=self._history_report,
        )
        self.api_url: str | None = None
        self.peer_port: int | None = None
        paths = config.paths
        self.downloads = Downloads(self.node_id, config.hub, log_dir=paths.logs_dir)
        self.pool = RunnerPool(
            self.router,
            models_dir=paths.models_dir,
            runner_logs_dir=paths.runner_logs_dir,
            downloads=self.downloads,
            runner_config=config.runner,
            runner_env=config.runner_env,
            restart_policy=config.runner_restart,
        )
        self._master: Master | None = None
        self._last_commands_seen = 0

    def _master_id(self) -> NodeId | None:
        session = self.sessions.session
        return session.master_id if session is not None else None

    def _model_ready(self, model: ModelRef, instance_id: InstanceId) -> None:
        if self._on_model_ready is not None and self.api_url is not None:
            self._on_model_ready(model, instance_id, self.api_url)

    def _model_failed(self, model: ModelRef, reason: str) -> None:
        if self._on_model_failed is not None and self.api_url is not None:
            self._on_model_failed(model, reason, self.api_url)

    def _commands_seen(self) -> int:
        """The election's tie-break: how much of the cluster's history this node has seen."""
        if self._master is not None:
            self._last_commands_seen = max(self._last_commands_seen, self._master.commands_seen)
        return max(self._last_commands_seen, self.sessions.state().last_index + 1)

    def _history_report(self) -> dict[str, Any]:
        """How much of the session's history this node holds (`/health`)."""
        view = self.sessions.view
        report: dict[str, Any] = {
            "last_index": self.sessions.state().last_index,
            "snapshots_applied": view.statistics().snapshots_applied if view else 0,
            "request_bodies_held": len(self.pool.bodies.held),
        }
        if self._master is not None:
            stats = self._master.statistics()
            report.update(
                events_in_memory=stats.events_in_memory,
                snapshot_index=stats.snapshot_index,
                snapshots_taken=stats.snapshots_taken,
                log_bytes=stats.log_bytes,
                older_sessions_log_bytes=stats.retained_log_bytes,
            )
        return report

    async def _restore_last_state(self) -> None:
        """A restarted node starts from what it last wrote as master: the placements it knew
        (`after_restart`), so a cluster of one keeps its models across a restart."""
        events_dir = self.config.paths.events_dir
        try:
            stored = await thread_pools.run_sync("event_log", read_newest_session, events_dir)
        except OSError as exc:
            log.warning("cannot read the event logs in %s (%s); starting afresh", events_dir, exc)
            return
        if stored is None:
            return
        state = after_restart(stored.state)
        self.sessions.last_state = state
        log.info(
            "restored %d instance(s) on %d node(s) from session %d's log",
            len(state.instances),
            len(state.nodes),
            stored.session.clock,
        )

    def _catalog(self) -> list[ModelRef]:
        return [
            *catalog.builtin_models(),
            *self.config.extra_models,
            *self.catalog_scan.models_dir_models(),
            *self.catalog_scan.hub_models(),
        ]

    async def run(
        self, *, task_status: trio.TaskStatus[NodeStarted] = trio.TASK_STATUS_IGNORED
    ) -> None:
        log.info("node %s starting; data in %s", self.node_id, self.config.paths.data_dir)
        decided_send, decided_receive = trio.open_memory_channel[Session](math.inf)
        sessions_send, sessions_receive = trio.open_memory_channel[Session](math.inf)
        await self._restore_last_state()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._relay_sessions, decided_receive, sessions_send)
            nursery.start_soon(self.prompt_counter.warm_up)
            if tracing():
                nursery.start_soon(self._trace_membership)
            await nursery.start(self.hub.run)
            transport = Transport(self.router, self.config.transport)
            self.peer_port = await nursery.start(transport.run)
            data_dir = self.config.paths.data_dir
            await thread_pools.run_sync("files", write_peer_port, data_dir, self.peer_port)
            # Before the election: static peers dialled during its boot grace are adopted.
            await nursery.start(Discovery(transport, self.config.discovery).run)
            # Node-lifetime: downloads, runners and their streams outlive sessions.
            await nursery.start(self.catalog_scan.run)  # before the API: its first scan is done
            await nursery.start(self.downloads.run)
            await nursery.start(self.pool.run)
            nursery.start_soon(self.client.fail_orphaned_streams)
            app = create_app(self.client, self.config.api)
            api = ApiServer(app, self.config.api)
            self.api_url = await nursery.start(api.run)
            supervisor = SessionSupervisor(
                sessions_receive, self._generation, policy=self.config.restart
            )
            await nursery.start(supervisor.run)
            election = Election(
                self.router,
                self.config.paths.data_dir,
                decided_send,
                config=self.config.election,
                commands_seen=self._commands_seen,
                force_master=self.config.force_master,
            )
            await nursery.start(election.run)
            if self.config.default_model is not None:
                default = DefaultModel(
                    self.client,
                    self.sessions,
                    self.config.default_model,
                    self._model_ready,
                    self._model_failed,
                )
                nursery.start_soon(default.run)
            log.info("node %s serving the API on %s", self.node_id, self.api_url)
            if api.ollama_url is not None:
                log.info("node %s serving the Ollama API also on %s", self.node_id, api.ollama_url)
            assert self.api_url is not None
            task_status.started(NodeStarted(self.node_id, self.api_url, api.ollama_url))

    async def wait_joined(self) -> None:
        """Until this node is in the cluster's state (its resources can be placed on)."""
        while self.node_id not in (state := self.sessions.state()).nodes:
            await self.sessions.wait_state_change(state)

    async def _trace_membership(self) -> None:
        peers = self.router.peers
        while True:
            now = await self.router.wait_peers_change(peers)
            for lost in peers - now:
                trace(self.node_id, "peer_lost", peer=lost)
            for joined in now - peers:
                trace(self.node_id, "peer_joined", peer=joined)
            peers = now

    async def _relay_sessions(
        self,
        decided: trio.MemoryReceiveChannel[Session],
        supervisor: trio.MemorySendChannel[Session],
    ) -> None:
        """Election -> supervisor. The old session is over the moment a new one is decided:
        commands wait for the new generation from then on instead of going to a dead master."""
        async with decided, supervisor:
            async for session in decided:
                trace(
                    self.node_id, "session_decided", clock=session.clock, master=session.master_id
                )
                self.sessions.set_session(None, None)
                await supervisor.send(session)

    async def _generation(self, session: Session, *, task_status: trio.TaskStatus[Any]) -> None:
        """One session's services. Returns only when all of them (and their runners) ended."""
        paths = self.config.paths
        try:
            async with trio.open_nursery() as generation:
                if session.master_id == self.node_id:
                    # Before the view: the view's first act is to ask the master for a replay.
                    # Carry the last session's placements over; the master drops what left.
                    master = Master(
                        self.router,
                        session,
                        paths.events_dir,
                        self.sessions.last_state,
                        config=self.config.master,
                    )
                    await generation.start(master.run)
                    self._master = master
                    trace(self.node_id, "master_started", clock=session.clock)
                view = StateView(self.router, session)
                await generation.start(view.run)
                trace(self.node_id, "view_started", clock=session.clock)
                worker = Worker(
                    router=self.router,
                    session=session,
                    view=view,
                    pool=self.pool,
                    downloads=self.downloads,
                    api_url=lambda: self.api_url,
                )
                await generation.start(worker.run)
                self.sessions.set_session(session, view)
                trace(self.node_id, "generation_started", clock=session.clock)
                task_status.started()
        finally:
            trace(self.node_id, "generation_exited", clock=session.clock)
            self._commands_seen()  # remember the count before the master goes
            self._master = None
            self.sessions.set_session(None, None)
