"""Idempotency keys, command ids and fingerprints (pure)."""

from __future__ import annotations

import attrs
import pytest

from trexo.config import MAX_IDEMPOTENCY_KEY_CHARS
from trexo.idempotency import (
    KEYED_PREFIX,
    command_fingerprint,
    keyed_command_id,
    parse_idempotency_key,
)
from trexo.types.commands import CancelTask, DeleteInstance, PlaceInstance
from trexo.types.ids import InstanceId, NodeId, RequestId
from trexo.types.models import ModelRef

MODEL = ModelRef("org/model", "hf:org/model@" + "a" * 40, 1000)


def test_a_key_names_one_command_per_operation() -> None:
    assert keyed_command_id("place", "k1") == keyed_command_id("place", "k1")
    assert keyed_command_id("place", "k1") != keyed_command_id("place", "k2")
    assert keyed_command_id("place", "k1") != keyed_command_id("delete", "k1")
    assert keyed_command_id("place", "k1").startswith(KEYED_PREFIX)
    # No separator trick makes two operations' keys meet.
    assert keyed_command_id("place", "x") != keyed_command_id("placex", "")


def test_a_fingerprint_is_what_was_asked_for() -> None:
    place = PlaceInstance("c1", MODEL, (NodeId("a"),), sharding="pipeline")
    assert command_fingerprint(place) == command_fingerprint(attrs.evolve(place, command_id="c2"))
    pinned_later = attrs.evolve(MODEL, source="hf:org/model@" + "b" * 40)
    assert command_fingerprint(place) == command_fingerprint(
        attrs.evolve(place, model=pinned_later)
    )
    for different in (
        attrs.evolve(place, node_ids=(NodeId("b"),)),
        attrs.evolve(place, sharding="tensor"),
        attrs.evolve(place, node_count=2),
        attrs.evolve(place, only_if_absent=True),
        attrs.evolve(place, model=attrs.evolve(MODEL, model_id="org/other")),
    ):
        assert command_fingerprint(different) != command_fingerprint(place), different
    delete = DeleteInstance("c1", InstanceId("i1"))
    assert command_fingerprint(delete) != command_fingerprint(
        DeleteInstance("c1", InstanceId("i2"))
    )
    assert command_fingerprint(CancelTask("c1", RequestId("r"))) is None


@pytest.mark.parametrize(
    "bad", ["", "x" * (MAX_IDEMPOTENCY_KEY_CHARS + 1), "tab\there", "é", "nul\x00"]
)
def test_a_malformed_key_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="Idempotency-Key"):
        parse_idempotency_key(bad)


def test_a_key_is_taken_as_sent() -> None:
    assert parse_idempotency_key(None) is None
    assert parse_idempotency_key("a b-c_9") == "a b-c_9"
    assert parse_idempotency_key("x" * MAX_IDEMPOTENCY_KEY_CHARS) is not None
