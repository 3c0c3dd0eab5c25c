"""Parsing `POST /instances` bodies: what is accepted, and the 400 for each bad value."""

from __future__ import annotations

from typing import Any

import pytest

from trexo.api.errors import ApiError
from trexo.api.instance_request import PlaceRequest, parse_place_instance
from trexo.types.ids import NodeId


@pytest.mark.parametrize(
    ("body", "parsed"),
    [
        ({"model": "m"}, PlaceRequest("m")),
        ({"model": "m", "node_id": "a"}, PlaceRequest("m", (NodeId("a"),))),
        ({"model": "m", "node_ids": ["b", "a"]}, PlaceRequest("m", (NodeId("b"), NodeId("a")))),
        ({"model": "m", "sharding": "tensor", "nodes": 2}, PlaceRequest("m", (), "tensor", 2)),
        (
            {"model": "m", "sharding": "pipeline", "nodes": 2, "node_ids": ["a", "b"]},
            PlaceRequest("m", (NodeId("a"), NodeId("b")), "pipeline", 2),
        ),
        # OpenAI treats null as absent
        (
            {"model": "m", "sharding": None, "nodes": None, "node_ids": None, "node_id": None},
            PlaceRequest("m"),
        ),
    ],
)
def test_accepted_bodies(body: dict[str, Any], parsed: PlaceRequest) -> None:
    assert parse_place_instance(body) == parsed


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "m", "sharding": "diagonal"}, "sharding", "invalid_value"),
        ({"model": "m", "sharding": 2}, "sharding", "invalid_type"),
        ({"model": "m", "nodes": 0}, "nodes", "invalid_value"),
        ({"model": "m", "nodes": "2"}, "nodes", "invalid_type"),
        ({"model": "m", "nodes": True}, "nodes", "invalid_type"),
        ({"model": "m", "nodes": 2.0}, "nodes", "invalid_type"),
        ({"model": "m", "nodes": 3, "node_ids": ["a", "b"]}, "nodes", "invalid_value"),
        ({"model": "m", "node_ids": "a"}, "node_ids", "invalid_type"),
        ({"model": "m", "node_ids": []}, "node_ids", "empty_array"),
        ({"model": "m", "node_ids": ["a", 1]}, "node_ids[1]", "invalid_type"),
        ({"model": "m", "node_ids": ["a", ""]}, "node_ids[1]", "invalid_value"),
        ({"model": "m", "node_ids": ["a", "b", "a"]}, "node_ids[2]", "invalid_value"),
        ({"model": "m", "node_ids": ["\udc00"]}, "node_ids[0]", "invalid_value"),
        ({"model": "m", "node_ids": ["a"], "node_id": "a"}, "node_id", "invalid_value"),
        ({"model": "m", "node_id": ""}, "node_id", "invalid_value"),
        ({"model": ""}, "model", "invalid_value"),
        ({"model": "m", "replicas": 2}, "replicas", "unknown_parameter"),
    ],
)
def test_bad_values_are_openai_style_400s(body: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_place_instance(body)
    error = info.value
    assert (error.status, error.param, error.code) == (400, param, code), error


def test_messages_say_what_was_expected() -> None:
    with pytest.raises(ApiError, match="expected one of pipeline, tensor, auto, but got 'x'"):
        parse_place_instance({"model": "m", "sharding": "x"})
    with pytest.raises(ApiError, match="node 'a' is listed twice"):
        parse_place_instance({"model": "m", "node_ids": ["a", "a"]})
    with pytest.raises(ApiError, match="3 nodes were asked for, but 2 node ids were given"):
        parse_place_instance({"model": "m", "nodes": 3, "node_ids": ["a", "b"]})
