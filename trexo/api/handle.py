"""What the API needs of the node: the one seam between HTTP and the cluster.

The node implements it (`trexo.node`); API tests may use a small fake. Every method that
talks to the cluster is bounded and raises a `trexo.errors.ClusterError` subclass the API
maps to an HTTP status: `NoSession` -> 503 with Retry-After, `ModelNotFound` /
`InstanceNotFound` -> 404, `PlacementRefused` / `CommandRefused` -> 400,
`GenerationFailed` -> an error event in a stream (500 before the first byte).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import attrs

from trexo.api.admission import PromptBudget
from trexo.types.chunks import Chunk
from trexo.types.commands import PlacementSharding
from trexo.types.generation import GenerationRequest
from trexo.types.ids import InstanceId, NodeId, RequestId
from trexo.types.models import ModelRef
from trexo.types.session import Session
from trexo.types.state import State


@attrs.frozen
class ModelListing:
    """A model the cluster knows: `/v1/models` lists these."""

    model: ModelRef
    placed: bool
    """At least one instance of it is placed (it may still be loading)."""
    ready: bool
    """At least one instance of it can serve now: its lead runner is ready or running."""
    downloaded: bool = False
    """This node has every file of it on disk (a demo model: built)."""


class NodeHandle(Protocol):
    node_id: NodeId

    def current_state(self) -> State:
        """The last state this node has applied (served during elections too)."""
        ...

    def current_session(self) -> Session | None:
        """The session this node follows now; None while it elects one."""
        ...

    async def wait_cluster_change(self, session: Session | None, state: State) -> None:
        """Until the session or the state is no longer `session` / `state` (what the caller
        last looked at from `current_session` and `current_state`). Unbounded: it waits
        across elections, as long as the node lives; bound it at the caller."""
        ...

    def health(self) -> dict[str, Any]:
        """A small JSON-able summary: node id, session (or None), ready runners."""
        ...

    def models(self) -> list[ModelListing]:
        """Models that can be placed, and whether each is placed now."""
        ...

    async def resolve_model(self, model_id: str) -> ModelRef:
        """The model `model_id` names, ready to place: a known one, or a Hugging Face repo
        (`org/name`) resolved on the hub and pinned to its current commit. Raises
        `ModelNotFound` (unknown), `RepoAccessDenied` (gated), `HubUnreachable`."""
        ...

    async def place_instance(
        self,
        model_id: str,
        node_ids: Sequence[NodeId] = (),
        *,
        sharding: PlacementSharding = "auto",
        node_count: int | None = None,
        idempotency_key: str | None = None,
    ) -> InstanceId:
        """Place a model by id, on exactly `node_ids` (rank order) or `node_count` nodes if
        given; returns at once with the new instance's id (it then loads). Under an
        `idempotency_key` used before for the same request, the first attempt's instance:
        a retry never places twice (`IdempotencyKeyReused` for a different request)."""
        ...

    async def delete_instance(
        self, instance_id: InstanceId, *, idempotency_key: str | None = None
    ) -> None:
        """Delete an instance; under a key used before, answered from that deletion."""
        ...

    async def prompt_budget(self, model_id: str, request: GenerationRequest) -> PromptBudget | None:
        """The request's prompt tokens and the model's context; None if this node cannot
        count them (the model's files are elsewhere: its runner then checks the limit).
        `GenerationRejected` if the model's chat template refuses the request."""
        ...

    async def check_schema(self, schema_json: str) -> None:
        """`ValueError` (a message for the client) unless the JSON schema compiles within
        this node's time and memory bounds; `Unavailable` if it cannot be checked now."""
        ...

    def open_generation(
        self, model_id: str, request: GenerationRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[Chunk]]:
        """Submit a generation and stream its chunks; leaving the block early cancels it.

        Raises `NoSession`, `ModelNotFound`, `ModelUnavailable` (placed but not serving now)
        on entry; the iterator raises `GenerationFailed`, `GenerationRejected` or
        `ModelUnavailable`.
        """
        ...

    async def cancel(self, request_id: RequestId) -> bool:
        """Cancel a running generation; False if no such generation is in flight."""
        ...
