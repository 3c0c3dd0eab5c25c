"""Hostile JSON bodies (deep nesting, huge numbers, NaN) get a 400 `invalid_json`, never a
500 with a traceback, and the server goes on serving."""

from __future__ import annotations

import json

import httpx
import pytest
import trio
from hostile_json import nest

from trexo.config import MAX_JSON_DEPTH, MAX_JSON_INT_DIGITS

from .test_bad_requests_http import GOOD, TEST_TIMEOUT_S, assert_error, assert_still_serving

HOSTILE_BODIES = [
    # (body, what the error message says)
    pytest.param(nest(1_000), "nested deeper than 64", id="deep-array"),  # ~2 KB, was a 500
    pytest.param(nest(2_000, closed=False), "nested deeper than 64", id="deep-unclosed"),
    pytest.param(nest(300, '{"a":', "1"), "nested deeper than 64", id="deep-object"),
    pytest.param(
        json.dumps({**GOOD, "user": "x"})[:-1] + ', "stop": ' + nest(MAX_JSON_DEPTH) + "}",
        "nested deeper than 64",  # one level more than the limit, inside a real request
        id="deep-field",
    ),
    pytest.param(
        json.dumps(GOOD)[:-1] + ', "seed": ' + "9" * 1_000 + "}",
        f"(at most {MAX_JSON_INT_DIGITS})",
        id="huge-int",
    ),
    pytest.param(json.dumps(GOOD)[:-1] + ', "temperature": 1e999}', "out of range", id="huge"),
    pytest.param(json.dumps(GOOD)[:-1] + ', "top_p": -Infinity}', "-Infinity", id="inf"),
]


@pytest.mark.parametrize(("body", "says"), HOSTILE_BODIES)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/instances"])
async def test_hostile_json_is_a_400(
    http: httpx.AsyncClient, path: str, body: str, says: str
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post(
            path, content=body.encode(), headers={"content-type": "application/json"}
        )
        assert_error(response, 400, "invalid_json")
        message = response.json()["error"]["message"]
        assert message.startswith("We could not parse the JSON body of your request: ")
        assert says in message
        assert "Traceback" not in response.text
        await assert_still_serving(http)


async def test_nesting_up_to_the_limit_is_parsed(http: httpx.AsyncClient) -> None:
    # Deep but within the limit: the body is parsed and the request validated as usual.
    body = json.dumps(GOOD)[:-1] + ', "stop": ' + nest(MAX_JSON_DEPTH - 1) + "}"
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.post("/v1/chat/completions", content=body.encode())
        assert response.status_code == 400
        assert response.json()["error"]["code"] != "invalid_json"
        assert response.json()["error"]["param"].startswith("stop")
