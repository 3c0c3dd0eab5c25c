"""Parse a `POST /instances` body. Pure: no I/O.

`{"model": id, "sharding"?: "auto" | "pipeline" | "tensor", "nodes"?: n,
"node_ids"?: [id, ...], "node_id"?: id}`; `node_id` is the older spelling of a one-node
`node_ids`.
"""

from __future__ import annotations

from typing import Any, get_args

import attrs

from trexo.api.errors import ApiError
from trexo.api.validation import (
    invalid_type,
    invalid_value,
    present,
    read_int,
    read_str,
    require_object,
    required_str,
    unknown,
    valid_text,
)
from trexo.types.commands import PlacementSharding
from trexo.types.ids import NodeId

PLACE_FIELDS = frozenset({"model", "sharding", "nodes", "node_ids", "node_id"})
SHARDINGS: tuple[PlacementSharding, ...] = get_args(PlacementSharding)


@attrs.frozen
class PlaceRequest:
    model_id: str
    node_ids: tuple[NodeId, ...] = ()
    """Exactly these nodes, in rank order; empty lets the master choose."""
    sharding: PlacementSharding = "auto"
    node_count: int | None = None


def parse_place_instance(body: Any) -> PlaceRequest:
    fields = present(require_object(body))
    for name in fields:
        if name not in PLACE_FIELDS:
            raise unknown(name)
    model = required_str(fields, "model")
    if not model:
        raise invalid_value("model", "expected a non-empty string")
    valid_text(model, "model")
    node_ids = _node_ids(fields)
    node_count = read_int(fields, "nodes", low=1)
    if node_count is not None and node_ids and node_count != len(node_ids):
        raise invalid_value(
            "nodes",
            f"{node_count} nodes were asked for, but {len(node_ids)} node ids were given",
        )
    return PlaceRequest(model, node_ids, _sharding(fields), node_count)


def _sharding(fields: dict[str, Any]) -> PlacementSharding:
    raw = read_str(fields, "sharding")
    if raw is None:
        return "auto"
    for sharding in SHARDINGS:
        if raw == sharding:
            return sharding
    raise invalid_value(
        "sharding", f"expected one of {', '.join(SHARDINGS)}, but got {raw!r} instead"
    )


def _node_ids(fields: dict[str, Any]) -> tuple[NodeId, ...]:
    single = read_str(fields, "node_id")
    if single == "":
        raise invalid_value("node_id", "expected a non-empty string")
    if single is not None:
        valid_text(single, "node_id")
    raw = fields.get("node_ids")
    if raw is None:
        return (NodeId(single),) if single else ()
    if single is not None:
        raise invalid_value("node_id", "give node_id or node_ids, not both")
    if not isinstance(raw, list):
        raise invalid_type("node_ids", "an array", raw)
    if not raw:
        raise ApiError(
            400,
            "Invalid 'node_ids': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            param="node_ids",
            code="empty_array",
        )
    ids: list[NodeId] = []
    for i, item in enumerate(raw):
        where = f"node_ids[{i}]"
        if not isinstance(item, str):
            raise invalid_type(where, "a string", item)
        if not item:
            raise invalid_value(where, "expected a non-empty string")
        valid_text(item, where)
        if item in ids:
            raise invalid_value(where, f"node {item!r} is listed twice")
        ids.append(NodeId(item))
    return tuple(ids)
