"""The dashboard in a real browser against a real node with an API key (`--api-key`).

The page's files load without the key; its first API call is a 401, so it asks for the key,
then sends it on every request: the live feed (read with fetch, which can send a header,
unlike EventSource), the catalog, a chat and its Stop.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.waiting import wait_until_sync
from trexo.runner.hooks import HOOKS_ENV

from .browser import click, console_errors, css, headless_chromium, shown, wait_on_page
from .cluster import WAIT_TIMEOUT_S, ClusterNode, shared_cluster
from .test_dashboard import (
    CHAT_MODEL,
    LONG_ANSWER_TOKENS,
    STEP_DELAY_S,
    chat_state,
    shown_master,
    stream_a_long_answer,
)

KEY = "sk-trexo-dashboard-test"
REFUSED = "the server responded with a status of 401"
"""Chromium's console line for a request answered 401: expected until the key is entered."""


def keyed_get(node: ClusterNode, path: str) -> Any:
    response = httpx.get(f"{node.url}{path}", headers={"Authorization": f"Bearer {KEY}"})
    response.raise_for_status()
    return response.json()


def chat_ready(node: ClusterNode) -> bool:
    return any(m["id"] == CHAT_MODEL and m["ready"] for m in keyed_get(node, "/v1/models")["data"])


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterNode]:
    root = tmp_path_factory.mktemp("dashboard-keys")
    env = {HOOKS_ENV: f"step_delay={STEP_DELAY_S}"}
    with shared_cluster(root, 1, "--no-model", "--api-key", KEY, env=env) as (node,):
        placed = httpx.post(
            f"{node.url}/instances",
            json={"model": CHAT_MODEL},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=30.0,
        )
        assert placed.status_code == 201, placed.text
        wait_until_sync(
            lambda: chat_ready(node), timeout=WAIT_TIMEOUT_S, what=f"{CHAT_MODEL} ready"
        )
        yield node


@pytest.fixture
def browser() -> Iterator[Any]:
    with headless_chromium() as driver:
        yield driver


def key_asked(driver: Any) -> bool:
    return bool(shown(driver, "#key-form:not([hidden])"))


def test_the_page_asks_for_the_key_then_shows_the_node_and_chats(
    node: ClusterNode, browser: Any
) -> None:
    assert httpx.get(f"{node.url}/state/events").status_code == 401
    browser.get(f"{node.url}/")
    wait_on_page(browser, key_asked, what="the key asked for")
    wait_on_page(
        browser, lambda d: shown(d, '#connection[data-state="locked"]'), what="the feed locked"
    )
    assert not shown(browser, "#nodes .node")

    css(browser, "#key-input")[0].send_keys(KEY)
    click(browser, "Use key", "#key-save")
    wait_on_page(
        browser, lambda d: shown(d, '#connection[data-state="live"]'), what="the live feed"
    )
    [card] = wait_on_page(
        browser, lambda d: shown(d, "#nodes .node", "nodeId", "master"), what="the node"
    )
    assert card["nodeId"] == node.node_id and card["master"] == "true"
    assert shown_master(browser) == node.node_id
    assert not key_asked(browser)

    # A chat streams with the key, and Stop cancels it in the runner (POST /v1/cancel).
    started = stream_a_long_answer(browser)
    click(browser, "Stop", "#chat-stop")
    wait_on_page(browser, lambda d: chat_state(d) == "stopped", what="the chat stopped")
    wait_until_sync(
        lambda: not keyed_get(node, "/state")["tasks"],
        timeout=WAIT_TIMEOUT_S,
        what="the runner idle again",
    )
    assert time.monotonic() - started < LONG_ANSWER_TOKENS * STEP_DELAY_S / 2
    assert not key_asked(browser)  # no request went without the key

    errors = console_errors(browser)
    refused = [e for e in errors if REFUSED in e["message"]]
    assert refused, json.dumps(errors, indent=1)  # the page's first try, before the key
    assert [e for e in errors if e not in refused] == [], json.dumps(errors, indent=1)
