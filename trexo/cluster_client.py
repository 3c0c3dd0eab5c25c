"""The node's side of `NodeHandle`: API calls become commands to the master and streams.

Node-lifetime, like the API. Every wait on the cluster is bounded: no session within
`command_wait` -> `NoSession` (HTTP 503, Retry-After); a master that does not reply in time
-> `NoSession` too (it is probably being replaced).
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

import trio

from trexo.api.admission import PromptBudget
from trexo.api.handle import ModelListing
from trexo.availability import (
    cluster_status,
    instance_availability,
    model_availability,
    problems,
)
from trexo.config import (
    CANCEL_SEND_TIMEOUT_S,
    COMMAND_RESEND_INITIAL_S,
    COMMAND_RESEND_MAX_S,
    COMMAND_WAIT_S,
    GENERATION_IDLE_TIMEOUT_S,
    HUB_RESOLVE_TIMEOUT_S,
    ORPHAN_GRACE_S,
    STREAM_SEND_TIMEOUT_S,
)
from trexo.errors import (
    ClusterError,
    CommandRefused,
    GenerationFailed,
    GenerationRejected,
    HubUnreachable,
    IdempotencyKeyReused,
    InstanceNotFound,
    ModelLoadFailed,
    ModelNotFound,
    ModelUnavailable,
    NodeNotFound,
    NoSession,
    PlacementRefused,
    TaskNotFound,
)
from trexo.hub.listing import is_repo_id
from trexo.idempotency import keyed_command_id
from trexo.net.router import PeerUnreachable, Router
from trexo.net.stream_hub import StreamEvent, StreamHub
from trexo.net.topics import Topic
from trexo.prompt_counter import PromptCounter
from trexo.schema_guard import SchemaGuard
from trexo.thread_pools import limiter
from trexo.types.chunks import Chunk
from trexo.types.commands import (
    CancelTask,
    Command,
    DeleteInstance,
    PlaceInstance,
    PlacementSharding,
    SubmitTask,
)
from trexo.types.failure import FailureKind
from trexo.types.generation import GenerationRequest
from trexo.types.ids import InstanceId, NodeId, RequestId, RunnerId, new_id
from trexo.types.ipc import PromptCacheStats
from trexo.types.models import ModelRef
from trexo.types.refusal import RefusalKind
from trexo.types.runner_status import RunnerReady, RunnerRunning
from trexo.types.session import Session
from trexo.types.state import State
from trexo.types.stream import CommandReply, StreamFailed, TaskBody
from trexo.worker.state_view import StateView

log = logging.getLogger(__name__)

_REFUSALS: dict[RefusalKind, type[ClusterError]] = {
    RefusalKind.MODEL_NOT_FOUND: ModelNotFound,
    RefusalKind.NODE_NOT_FOUND: NodeNotFound,
    RefusalKind.INSTANCE_NOT_FOUND: InstanceNotFound,
    RefusalKind.TASK_NOT_FOUND: TaskNotFound,
    RefusalKind.INSUFFICIENT_MEMORY: PlacementRefused,
    RefusalKind.UNSHARDABLE: PlacementRefused,
    RefusalKind.KEY_REUSED: IdempotencyKeyReused,
    RefusalKind.INVALID: CommandRefused,
}


class SessionTracker:
    """The current session and this node's view of it, with a change event for each."""

    def __init__(self) -> None:
        self.session: Session | None = None
        self.view: StateView | None = None
        self.last_state = State()
        self._changed = trio.Event()

    def set_session(self, session: Session | None, view: StateView | None) -> None:
        self.last_state = self.state()
        self.session = session
        self.view = view
        self._changed.set()
        self._changed = trio.Event()

    def state(self) -> State:
        """The session's state once its master has opened it; until then the last whole one.

        A view that has not caught up holds part of a state (or none): answered from, or
        carried over by this node if it becomes the next master, it would lose every
        placement it had not seen yet.
        """
        if self.view is not None and self.view.state.opened:
            return self.view.state
        return self.last_state

    async def wait_change(self) -> None:
        """Until the session changes (a new one, or none)."""
        await self._changed.wait()

    async def wait_session(self, bound: float) -> Session:
        with trio.move_on_after(bound):
            while self.session is None or self.view is None:
                await self._changed.wait()
            return self.session
        raise NoSession(f"no master elected within {bound:.0f} s; retry shortly")

    @property
    def opened(self) -> bool:
        """The current session's state is whole (its master opened it)."""
        return self.view is not None and self.view.state.opened

    async def wait_opened(self) -> None:
        """Until the current session's master has opened it (or the session changes)."""
        while not self.opened:
            await self.wait_state_change(self.state())

    async def wait_state_change(self, seen: State) -> None:
        """Until `state()` is no longer `seen` (the state the caller looked at), or the
        session changes. Passing what was seen closes the gap between looking and waiting."""
        view, session_changed = self.view, self._changed
        if self.state() is not seen:
            return
        if view is None:
            await session_changed.wait()
            return
        async with trio.open_nursery() as nursery:

            async def first(wait: Callable[[], Awaitable[object]]) -> None:
                await wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(
                first, lambda: view.wait_until(lambda state: state.opened and state is not seen)
            )
            nursery.start_soon(first, session_changed.wait)

    async def wait_change_from(self, session: Session | None, state: State) -> None:
        """Until the session or the state is no longer `session` / `state`, the ones the
        caller last looked at: a new session, an election starting, an event applied. (A
        state is replaced, never changed, on every event: identity tells a change.)"""
        while self.session == session and self.state() is state:
            await self.wait_state_change(state)


def stream_failure(failed: StreamFailed) -> ClusterError:
    """The error a failed stream raises, by what kind of failure it was."""
    match failed.kind:
        case FailureKind.INVALID_REQUEST:
            return GenerationRejected(failed.message)
        case FailureKind.UNAVAILABLE:
            return ModelUnavailable(failed.message)
    return GenerationFailed(failed.message)


class ChatStream:
    """A generation's chunks as they arrive; ends after the final chunk."""

    def __init__(self, events: trio.MemoryReceiveChannel[StreamEvent], idle_timeout: float) -> None:
        self._events = events
        self._idle_timeout = idle_timeout
        self.finished = False

    def __aiter__(self) -> ChatStream:
        return self

    async def __anext__(self) -> Chunk:
        if self.finished:
            raise StopAsyncIteration
        with trio.move_on_after(self._idle_timeout):
            event = await self._events.receive()
            if isinstance(event, StreamFailed):
                self.finished = True
                raise stream_failure(event)
            if event.chunk.finish_reason is not None:
                self.finished = True
            return event.chunk
        self.finished = True
        raise GenerationFailed(f"no output for {self._idle_timeout:.0f} s")


async def resolve_on_hub(
    resolve: Callable[[str], ModelRef], repo_id: str, *, bound: float
) -> ModelRef:
    """`resolve(repo_id)` (blocking: the hub's API) in a hub thread, within `bound` seconds in all;
    `HubUnreachable` (503, retry) past it.

    Hub threads are a pool of their own (`trexo.thread_pools`): a hub that drips its answer
    holds only hub look-ups. Past the bound the thread is left to end on the hub requests'
    own timeouts; it holds a hub thread until then, and no lock or file.
    """
    with trio.move_on_after(bound):
        return await trio.to_thread.run_sync(
            resolve, repo_id, limiter=limiter("hub"), abandon_on_cancel=True
        )
    raise HubUnreachable(f"the hub did not answer about {repo_id} within {bound:g} s")


def _command_id(operation: str, idempotency_key: str | None) -> str:
    """A command id: the same for every retry under one key, else a fresh one."""
    return new_id() if idempotency_key is None else keyed_command_id(operation, idempotency_key)


class ClusterClient:
    """Implements `trexo.api.handle.NodeHandle` for a node."""

    def __init__(
        self,
        router: Router,
        hub: StreamHub,
        sessions: SessionTracker,
        catalog: Callable[[], list[ModelRef]],
        *,
        command_wait: float = COMMAND_WAIT_S,
        idle_timeout: float = GENERATION_IDLE_TIMEOUT_S,
        prompt_counter: PromptCounter | None = None,
        schema_guard: SchemaGuard | None = None,
        resolve_hub_model: Callable[[str], ModelRef] | None = None,
        hub_resolve_timeout: float = HUB_RESOLVE_TIMEOUT_S,
        on_disk: Callable[[ModelRef], bool] = lambda _: False,
        prompt_caches: Callable[[], dict[RunnerId, PromptCacheStats]] = dict,
        history: Callable[[], dict[str, Any]] = dict,
    ) -> None:
        self._prompt_counter = prompt_counter
        self._schema_guard = schema_guard or SchemaGuard()
        self._accepted_in: dict[RequestId, Session] = {}
        """The session whose master accepted each open stream's task."""
        self._router = router
        self._hub = hub
        self._sessions = sessions
        self._catalog = catalog
        self._resolve_hub_model = resolve_hub_model
        """Blocking (the hub's API, in a worker thread): a repo id -> a pinned model."""
        self._hub_resolve_timeout = hub_resolve_timeout
        self._on_disk = on_disk
        self._prompt_caches = prompt_caches
        self._history = history
        self._command_wait = command_wait
        self._idle_timeout = idle_timeout
        self.node_id: NodeId = router.node_id

    # --- reads (answered from the last state, also during elections) -----------------------

    def current_state(self) -> State:
        return self._sessions.state()

    def current_session(self) -> Session | None:
        return self._sessions.session

    async def wait_cluster_change(self, session: Session | None, state: State) -> None:
        await self._sessions.wait_change_from(session, state)

    def health(self) -> dict[str, Any]:
        session = self._sessions.session
        state = self.current_state()
        ready = [
            r.runner_id
            for r in state.runners.values()
            if isinstance(r.status, RunnerReady | RunnerRunning)
        ]
        degraded = problems(state)
        return {
            "status": cluster_status(session, degraded),
            "problems": degraded,
            "node_id": self.node_id,
            "session": None
            if session is None
            else {"clock": session.clock, "master_id": session.master_id},
            "is_master": session is not None and session.master_id == self.node_id,
            # Until it is, what this node answers from is the last session's state.
            "session_opened": self._sessions.opened,
            "nodes": len(state.nodes),
            "instances": len(state.instances),
            "ready_runners": len(ready),
            "prompt_caches": {
                runner_id: {
                    "entries": cache.entries,
                    "bytes": cache.nbytes,
                    "max_bytes": cache.max_bytes,
                    "lookups": cache.lookups,
                    "hits": cache.hits,
                    "hit_rate": round(cache.hit_rate, 4),
                    "cached_tokens": cache.cached_tokens,
                }
                for runner_id, cache in self._prompt_caches().items()
            },
            "history": self._history(),
        }

    def models(self) -> list[ModelListing]:
        state = self.current_state()
        placed = {i.model.model_id for i in state.instances.values()}
        ready = {
            i.model.model_id
            for i in state.instances.values()
            if instance_availability(state, i).serving
        }
        known = {m.model_id: m for m in self._catalog()}
        for instance in state.instances.values():
            known[instance.model.model_id] = instance.model  # what the cluster runs
        return [
            ModelListing(m, m.model_id in placed, m.model_id in ready, self._on_disk(m))
            for m in known.values()
        ]

    def find_model(self, model_id: str) -> ModelRef:
        """The model `model_id` names: as placed in the cluster, else from the catalog.
        (On every chat request: no listing flags, no look at the disk, unless needed.)"""
        for instance in self.current_state().instances.values():
            if instance.model.model_id == model_id:
                return instance.model
        for model in self._catalog():
            if model.model_id == model_id:
                return model
        raise ModelNotFound(f"model {model_id!r} is not known to this cluster")

    async def resolve_model(self, model_id: str) -> ModelRef:
        try:
            model = self.find_model(model_id)
        except ModelNotFound:
            if self._resolve_hub_model is None or not is_repo_id(model_id):
                raise
            return await self._resolve_on_hub(model_id)
        return await self.pinned(model)

    async def pinned(self, model: ModelRef) -> ModelRef:
        """`model`, or, if it names a hub branch (`main`) rather than a commit, the model as
        the hub has it now: every node must fetch the same files."""
        revision = model.hub_revision
        if revision is not None and not revision.is_pinned:
            return await self._resolve_on_hub(model.model_id)
        return model

    async def _resolve_on_hub(self, repo_id: str) -> ModelRef:
        assert self._resolve_hub_model is not None
        model = await resolve_on_hub(
            self._resolve_hub_model, repo_id, bound=self._hub_resolve_timeout
        )
        log.info("resolved %s to %s", repo_id, model.source)
        return model

    # --- commands -------------------------------------------------------------------------

    async def command(self, command: Command) -> CommandReply:
        """Send `command` to the master and wait (bounded) for its reply; raise if refused.

        If the session changes before the reply (the master died with the command in
        flight), the command goes again to the next master, within the same bound.
        """
        with trio.move_on_after(self._command_wait):
            with self._hub.expect_reply(command.command_id) as replies:
                while True:
                    session = await self._sessions.wait_session(math.inf)
                    reply = await self._send_and_wait(session, command, replies)
                    if reply is None:
                        continue  # a new session: ask its master
                    if reply.error is not None:
                        kind = reply.error_kind or RefusalKind.INVALID
                        raise _REFUSALS[kind](reply.error)
                    return reply
        raise NoSession(f"no master answered within {self._command_wait:.0f} s; retry shortly")

    async def _send_and_wait(
        self,
        session: Session,
        command: Command,
        replies: trio.MemoryReceiveChannel[CommandReply],
    ) -> CommandReply | None:
        """The master's reply, or None once `session` is over (or its master unreachable)."""
        result: CommandReply | None = None
        async with trio.open_nursery() as nursery:

            async def receive() -> None:
                nonlocal result
                result = await replies.receive()
                nursery.cancel_scope.cancel()

            async def until_session_changes() -> None:
                while self._sessions.session == session:
                    await self._sessions.wait_change()
                nursery.cancel_scope.cancel()

            nursery.start_soon(receive)
            nursery.start_soon(until_session_changes)
            pause = COMMAND_RESEND_INITIAL_S
            opened = self._sessions.opened
            try:
                while True:
                    self._hub.sent_to(command.command_id, session.master_id)
                    await self._router.send(session.master_id, Topic.COMMANDS, command)
                    with trio.move_on_after(pause):
                        if opened:
                            await trio.sleep_forever()
                        # Sent before the new master subscribed, a command is not heard:
                        # once it has opened the session, send again at once.
                        await self._sessions.wait_opened()
                        opened = True
                        continue
                    pause = min(COMMAND_RESEND_MAX_S, 2 * pause)
            except PeerUnreachable:
                # Its link is gone: the election is about to replace it.
                await self._sessions.wait_change()
                nursery.cancel_scope.cancel()
        return result

    async def place_instance(
        self,
        model_id: str,
        node_ids: Sequence[NodeId] = (),
        *,
        sharding: PlacementSharding = "auto",
        node_count: int | None = None,
        only_if_absent: bool = False,
        idempotency_key: str | None = None,
    ) -> InstanceId:
        return await self.place_model(
            await self.resolve_model(model_id),
            node_ids,
            sharding=sharding,
            node_count=node_count,
            only_if_absent=only_if_absent,
            idempotency_key=idempotency_key,
        )

    async def place_model(
        self,
        model: ModelRef,
        node_ids: Sequence[NodeId] = (),
        *,
        sharding: PlacementSharding = "auto",
        node_count: int | None = None,
        only_if_absent: bool = False,
        idempotency_key: str | None = None,
    ) -> InstanceId:
        """Place `model` as given (see `place_instance`)."""
        command = PlaceInstance(
            _command_id("place", idempotency_key),
            model,
            tuple(node_ids),
            sharding=sharding,
            node_count=node_count,
            only_if_absent=only_if_absent,
        )
        reply = await self.command(command)
        assert reply.result_id is not None
        return InstanceId(reply.result_id)

    async def delete_instance(
        self, instance_id: InstanceId, *, idempotency_key: str | None = None
    ) -> None:
        await self.command(DeleteInstance(_command_id("delete", idempotency_key), instance_id))

    async def cancel(self, request_id: RequestId) -> bool:
        try:
            await self.command(CancelTask(new_id(), request_id))
        except TaskNotFound:
            return False
        return True

    async def prompt_budget(self, model_id: str, request: GenerationRequest) -> PromptBudget | None:
        if self._prompt_counter is None:
            return None
        return await self._prompt_counter.budget(self.find_model(model_id), request)

    async def check_schema(self, schema_json: str) -> None:
        await self._schema_guard.check(schema_json)

    async def fail_orphaned_streams(self) -> None:
        """Node-lifetime: after each session change, end the streams the new session lost.

        Generations keep streaming through a master change (runners belong to their nodes,
        and the new master carries tasks over or adopts them from the workers' reports). A
        task the new state does not list once it is open and the workers have reported (a
        grace) will never send more: its stream ends with a retryable error at once,
        instead of after the idle timeout.
        """
        while True:
            await self._sessions.wait_change()
            session = self._sessions.session
            if session is None:
                continue
            before = {rid for rid, s in self._accepted_in.items() if s != session}
            with trio.move_on_after(self._command_wait):
                while not self._sessions.opened:
                    await self._sessions.wait_state_change(self.current_state())
                await trio.sleep(ORPHAN_GRACE_S)
                state = self.current_state()
                for request_id in before & self._hub.open_streams - state.tasks.keys():
                    log.info("generation %s was lost with session %s", request_id, session)
                    self._hub.fail_stream(
                        request_id,
                        "the generation was lost while the cluster changed its master; retry",
                    )

    @asynccontextmanager
    async def open_generation(
        self, model_id: str, request: GenerationRequest
    ) -> AsyncIterator[AsyncIterator[Chunk]]:
        # Placed but not serving (loading, restarting): say so now, with when to retry,
        # rather than queue the request behind a runner that is not there.
        availability = model_availability(self.current_state(), model_id)
        if availability is not None and availability.for_good:
            raise ModelLoadFailed(availability.reason)
        if availability is not None and not availability.serving:
            raise ModelUnavailable(availability.reason, availability.retry_after)
        with self._hub.expect_stream(request.request_id) as events:
            rid = request.request_id
            try:
                reply = await self.command(SubmitTask(new_id(), model_id, self.node_id, rid))
            except NoSession:
                # The master may still take it from its queue: a cancel sent behind it on
                # the same link ends it there, rather than leave a task without a body.
                with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_SEND_TIMEOUT_S):
                    await self._cancel_quietly(rid)
                raise
            if self._sessions.session is not None:
                self._accepted_in[rid] = self._sessions.session
            stream = ChatStream(events, self._idle_timeout)
            if reply.lead_node is not None:
                self._hub.stream_from(rid, reply.lead_node)  # chunks from anyone else are not its
            try:
                await self._send_body(reply.lead_node, request)
                yield stream
            finally:
                self._accepted_in.pop(request.request_id, None)
                if not stream.finished:
                    with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_SEND_TIMEOUT_S):
                        await self._cancel_quietly(request.request_id)

    async def _send_body(self, lead_node: NodeId | None, request: GenerationRequest) -> None:
        """The request goes straight to the node whose runner generates it: the master and
        its log only ever see its id."""
        if lead_node is None:
            raise ModelUnavailable("the master did not say where the generation runs; retry")
        try:
            with trio.fail_after(STREAM_SEND_TIMEOUT_S):
                await self._router.send(lead_node, Topic.REQUESTS, TaskBody(request))
        except (PeerUnreachable, trio.TooSlowError):
            raise ModelUnavailable(
                f"the node serving this model ({lead_node}) cannot be reached; retry shortly"
            ) from None

    async def _cancel_quietly(self, request_id: RequestId) -> None:
        session = self._sessions.session
        if session is None:
            return
        with suppress(PeerUnreachable):
            await self._router.send(
                session.master_id, Topic.COMMANDS, CancelTask(new_id(), request_id)
            )
