"""A session: one master's reign, named by the election clock that chose it."""

from __future__ import annotations

import attrs

from trexo.types.ids import NodeId


@attrs.frozen(order=True)
class Session:
    clock: int
    master_id: NodeId
