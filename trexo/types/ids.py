"""Identifiers. Plain strings on the wire; distinct names in type hints."""

from __future__ import annotations

import uuid
from typing import NewType

NodeId = NewType("NodeId", str)
InstanceId = NewType("InstanceId", str)
RunnerId = NewType("RunnerId", str)
RequestId = NewType("RequestId", str)


def new_id() -> str:
    """A fresh random identifier (hex, 32 characters)."""
    return uuid.uuid4().hex
