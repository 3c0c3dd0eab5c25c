"""A scripted `NodeHandle` for HTTP tests: chunks on a timetable, errors on demand.

Like the real node, its generation context runs a nursery, so what the API raises inside
the block comes back wrapped in exception groups, and it records how each block was left.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import attrs
import trio

from trexo.api.admission import PromptBudget
from trexo.api.handle import ModelListing
from trexo.engine.schema_grammar import check_schema
from trexo.errors import (
    ClusterError,
    InstanceNotFound,
    ModelNotFound,
    NoSession,
    PlacementRefused,
)
from trexo.types.chunks import Chunk, FinishReason, Usage
from trexo.types.commands import PlacementSharding
from trexo.types.generation import GenerationRequest
from trexo.types.ids import InstanceId, NodeId, RequestId, RunnerId
from trexo.types.models import ModelLayout, ModelRef
from trexo.types.session import Session
from trexo.types.state import Instance, NodeInfo, RunnerAssignment, State

DEMO = ModelRef("demo-tiny", "demo:tiny", 3_400_000, layout=ModelLayout(4, 4, 2, 256))
OTHER = ModelRef("org/other-model", "/models/other", 10_000_000)
TOO_BIG = ModelRef("too-big", "/models/too-big", 10**15)
NODE_ID = NodeId("fake-node")
FAKE_CONTEXT = 100
"""The fake DEMO model's context, in (fake, one per word) tokens."""


@attrs.frozen
class Placement:
    """One `place_instance` call, as the fake received it."""

    model_id: str
    node_ids: tuple[NodeId, ...]
    sharding: PlacementSharding
    node_count: int | None


@attrs.frozen
class Step:
    """After `delay` seconds, yield `text` and `reasoning` (finishing with `finish`), or
    raise `error`."""

    delay: float = 0.0
    text: str = ""
    finish: FinishReason | None = None
    usage: Usage | None = None
    tokens: int = 1
    error: Exception | None = None
    reasoning: str = ""


HELLO = (
    Step(text="Hello"),
    Step(text=" world"),
    Step(text="!", finish="stop", usage=Usage(prompt_tokens=5, completion_tokens=3)),
)


class FakeNode:
    def __init__(self, script: tuple[Step, ...] = HELLO) -> None:
        self.node_id = NODE_ID
        self.script = script
        self.no_session = False
        self.requests: list[tuple[str, GenerationRequest]] = []
        self.exits: dict[RequestId, str] = {}
        """How each generation block was left: "completed", or the exception's class name."""
        self.entered: dict[RequestId, trio.Event] = {}
        self.finished: dict[RequestId, trio.Event] = {}
        self._cancel: dict[RequestId, trio.Event] = {}
        self.any_entered = trio.Event()
        self.placements: list[Placement] = []
        self.idempotency_keys: list[str | None] = []
        """Every `place_instance` call that named a known model, in order."""
        self.place_error: ClusterError | None = None
        self.generation_error: ClusterError | None = None
        """Raised on entering a generation (as the node raises what it knows up front)."""
        """Raised by `place_instance` (after recording the call) when set."""
        self._cluster_changed = trio.Event()
        self._session: Session | None = Session(1, NODE_ID)
        instance = Instance(
            InstanceId("inst-0"), DEMO, (RunnerAssignment(RunnerId("runner-0"), NODE_ID),)
        )
        self.state = State(
            nodes={NODE_ID: NodeInfo(NODE_ID, "fakehost", 16 * 2**30, 8 * 2**30)},
            instances={instance.instance_id: instance},
            last_index=3,
        )

    @property
    def state(self) -> State:
        return self._state

    @state.setter
    def state(self, state: State) -> None:
        self._state = state
        self._notify_cluster_changed()

    @property
    def session(self) -> Session | None:
        """What `/state/events` reports as the session (`no_session` is what commands see)."""
        return self._session

    @session.setter
    def session(self, session: Session | None) -> None:
        self._session = session
        self._notify_cluster_changed()

    def _notify_cluster_changed(self) -> None:
        self._cluster_changed.set()
        self._cluster_changed = trio.Event()

    # --- NodeHandle ---------------------------------------------------------------------------

    def current_state(self) -> State:
        return self.state

    def current_session(self) -> Session | None:
        return self._session

    async def wait_cluster_change(self, session: Session | None, state: State) -> None:
        while self._session == session and self._state is state:
            await self._cluster_changed.wait()

    def health(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "session": None if self.no_session else "s-1"}

    async def prompt_budget(self, model_id: str, request: GenerationRequest) -> PromptBudget | None:
        """One token per word of the messages; DEMO has a context of `FAKE_CONTEXT`."""
        await trio.lowlevel.checkpoint()
        if model_id != DEMO.model_id or request.messages is None:
            return None
        return PromptBudget(sum(len(m.content.split()) for m in request.messages), FAKE_CONTEXT)

    async def check_schema(self, schema_json: str) -> None:
        """llguidance's own check, in this process (the bounded one starts a process)."""
        await trio.lowlevel.checkpoint()
        check_schema(schema_json)

    def models(self) -> list[ModelListing]:
        loaded = {instance.model.model_id for instance in self.state.instances.values()}
        return [
            ModelListing(m, m.model_id in loaded, m.model_id in loaded)
            for m in (DEMO, OTHER, TOO_BIG)
        ]

    async def resolve_model(self, model_id: str) -> ModelRef:
        await trio.lowlevel.checkpoint()
        return self._model(model_id)

    async def place_instance(
        self,
        model_id: str,
        node_ids: Sequence[NodeId] = (),
        *,
        sharding: PlacementSharding = "auto",
        node_count: int | None = None,
        idempotency_key: str | None = None,
    ) -> InstanceId:
        await trio.lowlevel.checkpoint()
        self.idempotency_keys.append(idempotency_key)
        if self.no_session:
            raise NoSession()
        model = self._model(model_id)
        self.placements.append(Placement(model_id, tuple(node_ids), sharding, node_count))
        if self.place_error is not None:
            raise self.place_error
        if model is TOO_BIG:
            raise PlacementRefused(f"{model_id} needs more memory than the cluster has")
        instance_id = InstanceId(f"inst-{len(self.state.instances)}")
        node_id = node_ids[0] if node_ids else NODE_ID
        assignment = RunnerAssignment(RunnerId(f"runner-{instance_id}"), node_id)
        instances = {
            **self.state.instances,
            instance_id: Instance(instance_id, model, (assignment,)),
        }
        self.state = attrs.evolve(self.state, instances=instances)
        return instance_id

    async def delete_instance(
        self, instance_id: InstanceId, *, idempotency_key: str | None = None
    ) -> None:
        await trio.lowlevel.checkpoint()
        self.idempotency_keys.append(idempotency_key)
        if self.no_session:
            raise NoSession()
        if instance_id not in self.state.instances:
            raise InstanceNotFound(f"no instance {instance_id}")
        instances = {k: v for k, v in self.state.instances.items() if k != instance_id}
        self.state = attrs.evolve(self.state, instances=instances)

    def open_generation(
        self, model_id: str, request: GenerationRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[Chunk]]:
        return self._generation(model_id, request)

    async def cancel(self, request_id: RequestId) -> bool:
        await trio.lowlevel.checkpoint()
        if request_id not in self._cancel:
            return False
        self._cancel[request_id].set()
        return True

    # --- the fake's own -----------------------------------------------------------------------

    def only_request_id(self) -> RequestId:
        [(_, request)] = self.requests
        return request.request_id

    def _model(self, model_id: str) -> ModelRef:
        for model in (DEMO, OTHER, TOO_BIG):
            if model.model_id == model_id:
                return model
        raise ModelNotFound(f"The model '{model_id}' does not exist.")

    @asynccontextmanager
    async def _generation(
        self, model_id: str, request: GenerationRequest
    ) -> AsyncIterator[AsyncIterator[Chunk]]:
        await trio.lowlevel.checkpoint()
        if self.no_session:
            raise NoSession()
        if self.generation_error is not None:
            raise self.generation_error
        self._model(model_id)
        request_id = request.request_id
        self.requests.append((model_id, request))
        self.finished[request_id] = trio.Event()
        cancel = self._cancel[request_id] = trio.Event()
        outcome = "completed"
        self.any_entered.set()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.sleep_forever)  # a stand-in for the node's stream task
                yield self._chunks(request_id, cancel)
                nursery.cancel_scope.cancel()
        except BaseException as exc:
            outcome = _leaf_name(exc)
            raise
        finally:
            self.exits[request_id] = outcome
            del self._cancel[request_id]
            self.finished[request_id].set()

    async def _chunks(self, request_id: RequestId, cancel: trio.Event) -> AsyncIterator[Chunk]:
        sent = 0
        for step in self.script:
            with trio.move_on_after(step.delay):
                await cancel.wait()
            if cancel.is_set():
                yield Chunk(request_id, "", finish_reason="cancelled", usage=Usage(5, sent))
                return
            if step.error is not None:
                raise step.error
            sent += step.tokens
            yield Chunk(
                request_id,
                step.text,
                token_ids=tuple(range(step.tokens)),
                finish_reason=step.finish,
                usage=step.usage,
                reasoning=step.reasoning,
            )


def _leaf_name(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return type(exc).__name__
