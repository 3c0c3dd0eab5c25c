"""Why the master refused a command: one kind per error the API answers differently."""

from __future__ import annotations

import enum


class RefusalKind(enum.Enum):
    """Carried in `CommandReply.error_kind`; the node maps each to its `ClusterError`."""

    MODEL_NOT_FOUND = "model_not_found"
    NODE_NOT_FOUND = "node_not_found"
    INSTANCE_NOT_FOUND = "instance_not_found"
    TASK_NOT_FOUND = "task_not_found"
    INSUFFICIENT_MEMORY = "insufficient_memory"
    UNSHARDABLE = "unshardable"
    """The model cannot be split as asked (no known layout, too few layers, heads not
    divisible by the node count)."""
    KEY_REUSED = "key_reused"
    """The command's idempotency key was used before for a different request."""
    INVALID = "invalid"
