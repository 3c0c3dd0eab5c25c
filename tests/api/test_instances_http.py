"""`POST /instances` with a sharding, a node count or node ids, and `GET /instances/previews`,
over real HTTP to a fake node."""

from __future__ import annotations

import attrs
import httpx
import pytest
import trio

from trexo.errors import ClusterError, CommandRefused, NodeNotFound, PlacementRefused
from trexo.master.previews import PlacementPreview, previews
from trexo.types.ids import NodeId
from trexo.types.state import NodeInfo
from trexo.wire import converter

from .fake_node import DEMO, NODE_ID, OTHER, FakeNode, Placement

TEST_TIMEOUT_S = 30.0
GiB = 2**30


async def post(http: httpx.AsyncClient, body: object) -> httpx.Response:
    with trio.fail_after(TEST_TIMEOUT_S):
        return await http.post("/instances", json=body)


async def get_previews(http: httpx.AsyncClient, params: dict[str, str]) -> httpx.Response:
    with trio.fail_after(TEST_TIMEOUT_S):
        return await http.get("/instances/previews", params=params)


@pytest.mark.parametrize(
    ("body", "placement"),
    [
        ({"model": DEMO.model_id}, Placement(DEMO.model_id, (), "auto", None)),
        (
            {"model": DEMO.model_id, "sharding": "tensor", "nodes": 2},
            Placement(DEMO.model_id, (), "tensor", 2),
        ),
        (
            {"model": DEMO.model_id, "sharding": "pipeline", "node_ids": ["n2", "n1"]},
            Placement(DEMO.model_id, (NodeId("n2"), NodeId("n1")), "pipeline", None),
        ),
        (
            {"model": DEMO.model_id, "node_id": "n3"},
            Placement(DEMO.model_id, (NodeId("n3"),), "auto", None),
        ),
    ],
)
async def test_place_passes_the_split_to_the_node(
    http: httpx.AsyncClient, node: FakeNode, body: object, placement: Placement
) -> None:
    response = await post(http, body)
    assert response.status_code == 201, response.text
    assert node.placements == [placement]
    assert response.json()["instance_id"] in node.state.instances


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": DEMO.model_id, "sharding": "diagonal"}, "sharding", "invalid_value"),
        ({"model": DEMO.model_id, "nodes": 0}, "nodes", "invalid_value"),
        ({"model": DEMO.model_id, "nodes": "two"}, "nodes", "invalid_type"),
        ({"model": DEMO.model_id, "node_ids": []}, "node_ids", "empty_array"),
        ({"model": DEMO.model_id, "node_ids": ["a", "a"]}, "node_ids[1]", "invalid_value"),
        ({"model": DEMO.model_id, "node_ids": ["a"], "node_id": "b"}, "node_id", "invalid_value"),
        ({"model": DEMO.model_id, "nodes": 1, "node_ids": ["a", "b"]}, "nodes", "invalid_value"),
    ],
)
async def test_bad_split_values_are_400s_and_reach_no_node(
    http: httpx.AsyncClient, node: FakeNode, body: object, param: str, code: str
) -> None:
    response = await post(http, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (
        param,
        code,
        "invalid_request_error",
    )
    assert node.placements == []


@pytest.mark.parametrize(
    ("refusal", "code"),
    [
        # RefusalKind.UNSHARDABLE and INSUFFICIENT_MEMORY reach the API as PlacementRefused,
        # INVALID as CommandRefused, NODE_NOT_FOUND as NodeNotFound (see cluster_client).
        (
            PlacementRefused("model demo-tiny cannot be tensor-sharded across 3 nodes"),
            "placement_refused",
        ),
        (CommandRefused("3 nodes were asked for, the cluster has 2"), "command_refused"),
        (NodeNotFound("node x is not in the cluster"), "node_not_found"),
    ],
)
async def test_master_refusals_are_400s_with_their_message(
    http: httpx.AsyncClient, node: FakeNode, refusal: ClusterError, code: str
) -> None:
    node.place_error = refusal
    response = await post(http, {"model": DEMO.model_id, "sharding": "tensor", "nodes": 3})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["message"], error["code"]) == (str(refusal), code)


async def test_previews_list_every_candidate_placement(
    http: httpx.AsyncClient, node: FakeNode
) -> None:
    second = NodeId("fake-node-2")
    nodes = {**node.state.nodes, second: NodeInfo(second, "otherhost", 4 * GiB, 2 * GiB)}
    node.state = attrs.evolve(node.state, nodes=nodes)
    response = await get_previews(http, {"model": DEMO.model_id})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == DEMO.model_id
    expected = previews(node.state, DEMO)
    assert body["previews"] == [converter.unstructure(p, PlacementPreview) for p in expected]
    assert [(p["sharding"], p["node_ids"]) for p in body["previews"]] == [
        ("whole", [NODE_ID]),
        ("whole", [second]),
        ("pipeline", [NODE_ID, second]),
        ("tensor", [NODE_ID, second]),
    ]
    pipeline = body["previews"][2]
    assert pipeline["feasible"] is True
    assert [(r["rank"], r["start_layer"], r["end_layer"]) for r in pipeline["ranks"]] == [
        (0, 0, 3),  # 8 GiB and 2 GiB free (minus the placed demo model): 4 layers at ~4:1
        (1, 3, 4),
    ]


async def test_previews_of_a_model_with_a_slash_in_its_id(http: httpx.AsyncClient) -> None:
    response = await get_previews(http, {"model": OTHER.model_id})
    assert response.status_code == 200, response.text
    assert response.json()["model"] == OTHER.model_id
    [whole] = response.json()["previews"]
    assert whole["feasible"] is True


@pytest.mark.parametrize(
    ("params", "status", "code"),
    [
        ({"model": "nope"}, 404, "model_not_found"),
        ({}, 400, "missing_required_parameter"),
        ({"model": ""}, 400, "invalid_value"),
    ],
)
async def test_previews_errors(
    http: httpx.AsyncClient, params: dict[str, str], status: int, code: str
) -> None:
    response = await get_previews(http, params)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("model", code)


async def test_previews_answer_during_an_election(http: httpx.AsyncClient, node: FakeNode) -> None:
    node.no_session = True  # a read: answered from the last state
    response = await get_previews(http, {"model": DEMO.model_id})
    assert response.status_code == 200, response.text
