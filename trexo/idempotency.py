"""Idempotency keys: a client's retry of a placement or a deletion is the same command.

A command that timed out waiting for a master (HTTP 503, "retry") may still be carried out:
it can sit in a slow master's queue, or reach a master whose reply is lost in a failover.
So the API names every placement and deletion by a key (the client's `Idempotency-Key`
header, or one it makes up and returns with the 503), the command id is derived from it,
and the cluster state remembers what each command id did (`State.commands`): a retry with
the key is answered from the first attempt's result, never carried out twice. A key sent
again with a different request is refused rather than answered with another's result.
Pure functions.
"""

from __future__ import annotations

import hashlib
import json

from trexo.config import MAX_IDEMPOTENCY_KEY_CHARS
from trexo.types.commands import Command, DeleteInstance, PlaceInstance

IDEMPOTENCY_HEADER = "Idempotency-Key"
KEYED_PREFIX = "key-"
"""Command ids derived from a key start so (others are random ids), for the logs' readers."""
KEY_REUSED_MESSAGE = "this idempotency key was used for a different request; use a new key"


def keyed_command_id(operation: str, key: str) -> str:
    """The command id for `operation` ("place", "delete") under `key`: the same for every
    retry, and different operations under one key never collide."""
    digest = hashlib.sha256(f"{operation}\0{key}".encode()).hexdigest()
    return f"{KEYED_PREFIX}{digest[:32]}"


def command_fingerprint(command: Command) -> str | None:
    """What a placement or deletion asks for (all but its id), as a short digest; None for
    commands that are not remembered by key.

    A placement is fingerprinted by the model's id, not its pinned revision: a retry that
    resolves a hub branch to a newer commit asks for the same thing.
    """
    match command:
        case PlaceInstance():
            asked: list[object] = [
                "place",
                command.model.model_id,
                list(command.node_ids),
                command.sharding,
                command.node_count,
                command.only_if_absent,
            ]
        case DeleteInstance():
            asked = ["delete", command.instance_id]
        case _:
            return None
    return hashlib.sha256(json.dumps(asked).encode()).hexdigest()[:16]


def parse_idempotency_key(value: str | None) -> str | None:
    """The key a client sent, or None; `ValueError` (a message for the client) unless it is
    1 to `MAX_IDEMPOTENCY_KEY_CHARS` printable ASCII characters."""
    if value is None:
        return None
    if not 0 < len(value) <= MAX_IDEMPOTENCY_KEY_CHARS or not all(" " <= ch <= "~" for ch in value):
        raise ValueError(
            f"{IDEMPOTENCY_HEADER} must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} printable ASCII"
            " characters"
        )
    return value
