"""Models, state, health, instances: the API's reads and commands over a fake node."""

from __future__ import annotations

import httpx
import openai
import pytest
import trio

from trexo.errors import IdempotencyKeyReused, ModelLoadFailed, NoDiskSpace
from trexo.types.state import State
from trexo.wire import converter

from .fake_node import DEMO, OTHER, TOO_BIG, FakeNode

TEST_TIMEOUT_S = 30.0


async def test_models_list_in_openai_format(http: httpx.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert [(m["id"], m["placed"], m["ready"], m["loaded"]) for m in body["data"]] == [
        (DEMO.model_id, True, True, True),
        (OTHER.model_id, False, False, False),
        (TOO_BIG.model_id, False, False, False),
    ]
    for model in body["data"]:
        assert model["object"] == "model"
        assert model["owned_by"] == "trexo"
        assert isinstance(model["created"], int)


async def test_openai_client_lists_models(client: openai.AsyncOpenAI) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        ids = [model.id async for model in client.models.list()]
        model = await client.models.retrieve(OTHER.model_id)  # an id with a slash
    assert ids == [DEMO.model_id, OTHER.model_id, TOO_BIG.model_id]
    assert model.id == OTHER.model_id


async def test_get_unknown_model_is_404(http: httpx.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.get("/v1/models/nope")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


async def test_state_is_the_wire_json_of_the_nodes_state(
    http: httpx.AsyncClient, node: FakeNode
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.get("/state")
    assert response.status_code == 200
    assert response.json() == converter.unstructure(node.current_state(), State)
    assert converter.structure(response.json(), State) == node.current_state()


async def test_health(http: httpx.AsyncClient, node: FakeNode) -> None:
    node.no_session = True  # reads answer during elections too
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.get("/health")
    assert response.status_code == 200
    assert response.json() == {"node_id": "fake-node", "session": None}


async def test_place_list_and_delete_instances(http: httpx.AsyncClient, node: FakeNode) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        placed = await http.post("/instances", json={"model": OTHER.model_id, "node_id": "n2"})
        assert placed.status_code == 201
        instance_id = placed.json()["instance_id"]
        assert node.state.instances[instance_id].node_ids == ("n2",)

        listed = (await http.get("/instances")).json()
        assert listed["object"] == "list"
        assert {i["instance_id"] for i in listed["data"]} == {"inst-0", instance_id}

        deleted = await http.delete(f"/instances/{instance_id}")
        assert deleted.status_code == 200
        assert deleted.json() == {"instance_id": instance_id, "deleted": True}
        assert instance_id not in node.state.instances

        again = await http.delete(f"/instances/{instance_id}")
        assert again.status_code == 404
        assert again.json()["error"]["code"] == "instance_not_found"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"model": "nope"}, 404, "model_not_found"),
        ({"model": TOO_BIG.model_id}, 400, "placement_refused"),
        ({}, 400, "missing_required_parameter"),
        ({"model": 3}, 400, "invalid_type"),
        ({"model": DEMO.model_id, "replicas": 2}, 400, "unknown_parameter"),
        ([DEMO.model_id], 400, "invalid_type"),
    ],
)
async def test_place_instance_errors(
    http: httpx.AsyncClient, body: object, status: int, code: str
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post("/instances", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


async def test_place_instance_without_session_is_503(
    http: httpx.AsyncClient, node: FakeNode
) -> None:
    node.no_session = True
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post("/instances", json={"model": DEMO.model_id})
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "no_session"


async def test_a_503_names_the_key_its_retry_is_carried_out_once_under(
    http: httpx.AsyncClient, node: FakeNode
) -> None:
    node.no_session = True
    with trio.fail_after(TEST_TIMEOUT_S):
        failed = await http.post("/instances", json={"model": DEMO.model_id})
        key = failed.headers["idempotency-key"]
        assert failed.status_code == 503
        assert f"Idempotency-Key: {key}" in failed.json()["error"]["message"]
        node.no_session = False
        retried = await http.post(
            "/instances", json={"model": DEMO.model_id}, headers={"Idempotency-Key": key}
        )
    assert retried.status_code == 201
    assert retried.headers["idempotency-key"] == key
    assert node.idempotency_keys == [key, key]


async def test_every_placement_and_deletion_goes_under_a_key(
    http: httpx.AsyncClient, node: FakeNode
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        mine = await http.post(
            "/instances", json={"model": DEMO.model_id}, headers={"Idempotency-Key": "my key 1"}
        )
        made_up = await http.post("/instances", json={"model": DEMO.model_id})
        node.no_session = True
        deletion = await http.delete(f"/instances/{mine.json()['instance_id']}")
    assert mine.headers["idempotency-key"] == "my key 1"
    generated = made_up.headers["idempotency-key"]
    assert deletion.status_code == 503
    assert node.idempotency_keys == ["my key 1", generated, deletion.headers["idempotency-key"]]
    assert len(set(node.idempotency_keys)) == 3


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9"])
async def test_a_malformed_key_is_a_400_before_anything_happens(
    http: httpx.AsyncClient, node: FakeNode, key: str
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post(
            "/instances",
            json={"model": DEMO.model_id},
            headers={"Idempotency-Key": key.encode()},  # type: ignore[dict-item]
        )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_header"
    assert node.idempotency_keys == []


async def test_a_key_reused_for_another_request_is_a_422(
    http: httpx.AsyncClient, node: FakeNode
) -> None:
    node.place_error = IdempotencyKeyReused("this idempotency key was used for a different request")
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post(
            "/instances", json={"model": DEMO.model_id}, headers={"Idempotency-Key": "k"}
        )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "idempotency_key_reused"


async def test_a_full_disk_is_a_507_that_says_so(http: httpx.AsyncClient, node: FakeNode) -> None:
    node.place_error = NoDiskSpace("org/model needs 4.0 GiB, /cache has 1.0 GiB free")
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post("/instances", json={"model": DEMO.model_id})
    assert response.status_code == 507
    assert response.json()["error"] == {
        "message": "org/model needs 4.0 GiB, /cache has 1.0 GiB free",
        "type": "server_error",
        "param": None,
        "code": "insufficient_storage",
    }


async def test_a_model_that_failed_to_load_for_good_is_a_500_with_the_cause(
    http: httpx.AsyncClient, node: FakeNode
) -> None:
    # Not a 503 "retry shortly": no retry would make it load.
    node.generation_error = ModelLoadFailed("model m cannot serve: … (ValueError: shapes differ)")
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post(
            "/v1/chat/completions",
            json={"model": DEMO.model_id, "messages": [{"role": "user", "content": "hi"}]},
        )
    assert response.status_code == 500
    assert "retry-after" not in response.headers
    error = response.json()["error"]
    assert error["code"] == "model_load_failed" and "shapes differ" in error["message"]
