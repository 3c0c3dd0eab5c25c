"""Parse a `POST /instances` body: `{"model": id, "node_id"?: id}`. Pure: no I/O."""

from __future__ import annotations

from typing import Any

import attrs

from trexo.api.validation import (
    invalid_value,
    present,
    read_str,
    require_object,
    required_str,
    unknown,
)
from trexo.types.ids import NodeId

PLACE_FIELDS = frozenset({"model", "node_id"})


@attrs.frozen
class PlaceInstance:
    model_id: str
    node_id: NodeId | None = None
    """Place on this node; None lets the master choose."""


def parse_place_instance(body: Any) -> PlaceInstance:
    fields = present(require_object(body))
    for name in fields:
        if name not in PLACE_FIELDS:
            raise unknown(name)
    model = required_str(fields, "model")
    if not model:
        raise invalid_value("model", "expected a non-empty string")
    node_id = read_str(fields, "node_id")
    if node_id == "":
        raise invalid_value("node_id", "expected a non-empty string")
    return PlaceInstance(model_id=model, node_id=NodeId(node_id) if node_id else None)
