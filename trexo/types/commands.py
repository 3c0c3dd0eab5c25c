"""Commands: requests to the master, which validates them and turns them into events."""

from __future__ import annotations

from typing import Literal

import attrs

from trexo.types.ids import InstanceId, NodeId, RequestId
from trexo.types.models import ModelRef

PlacementSharding = Literal["pipeline", "tensor", "auto"]
"""How a placement may split a model: "auto" keeps it whole on one node if it fits there,
else splits it as a pipeline over the fewest nodes that fit."""


@attrs.frozen
class PlaceInstance:
    """Place `model`: on exactly `node_ids` (in that rank order) if given, else on
    `node_count` nodes if given, else wherever it fits on the fewest nodes.

    With `only_if_absent`, an existing instance of the model is the answer instead (how
    every node can ask for the default model and the cluster still gets one).
    """

    command_id: str
    model: ModelRef
    node_ids: tuple[NodeId, ...] = ()
    """Empty: the master chooses."""
    sharding: PlacementSharding = "auto"
    node_count: int | None = None
    only_if_absent: bool = False


@attrs.frozen
class DeleteInstance:
    command_id: str
    instance_id: InstanceId


@attrs.frozen
class SubmitTask:
    """Run generation `request_id` on an instance of `model_id`; chunks go to `origin_node`.

    The request itself goes from the origin to the chosen instance's lead node (`TaskBody`)
    once the master's reply names that node: the master never holds what a user typed.
    """

    command_id: str
    model_id: str
    origin_node: NodeId
    request_id: RequestId


@attrs.frozen
class CancelTask:
    command_id: str
    task_id: RequestId


@attrs.frozen
class RequestReplay:
    """Send me the session's events from `from_index` on (a gap, or a late joiner)."""

    command_id: str
    from_index: int


Command = PlaceInstance | DeleteInstance | SubmitTask | CancelTask | RequestReplay
