"""The dashboard in a real browser (headless Chromium) against a real 3-node cluster.

The page is loaded from n1, a follower; n0, started first, is the master; the chat model
runs on n2, so a chat from the page crosses nodes. The tests run in this order and share
the cluster: the last one kills the master. Runners generate slowly here (a test hook
delays every decode step), so a chat can be stopped midway.

With TREXO_DASHBOARD_SCREENSHOTS=DIR the tests save what the page looks like into DIR
(`docs/` holds the ones the README shows).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from trexo.runner.hooks import HOOKS_ENV

from .browser import click, console_errors, css, headless_chromium, wait_until
from .cluster import ClusterNode, shared_cluster, wait_for

CHAT_MODEL = "trexo-demo-tiny"
SPLIT_MODEL = "trexo-demo-tiny-varied"
STEP_DELAY_S = 0.05
"""Per decode step: a 1000-token answer would take 50 s, so a stop is plainly early."""
LONG_ANSWER_TOKENS = 1000
SHOWN_WITHIN_S = 5.0
"""How soon the page must show a failover: measured ~0.2 s here; generous for loaded machines."""
SCREENSHOTS_ENV = "TREXO_DASHBOARD_SCREENSHOTS"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ClusterNode]]:
    root = tmp_path_factory.mktemp("dashboard")
    env = {HOOKS_ENV: f"step_delay={STEP_DELAY_S}"}
    with shared_cluster(root, 3, "--no-model", env=env) as nodes:
        _, n1, n2 = nodes
        placed = httpx.post(
            f"{n1.url}/instances",
            json={"model": CHAT_MODEL, "node_id": n2.node_id},
            timeout=30.0,
        )
        assert placed.status_code == 201, placed.text
        wait_for(f"{CHAT_MODEL} ready", lambda: model_ready(n1, CHAT_MODEL))
        yield nodes


@pytest.fixture
def browser() -> Iterator[Any]:
    """A fresh browser per test: its processes are reaped when the test ends."""
    with headless_chromium() as driver:
        yield driver


def model_ready(node: ClusterNode, model_id: str) -> bool:
    return any(m["id"] == model_id and m["ready"] for m in node.get("/v1/models")["data"])


def choose(driver: Any, selector: str, value: str) -> None:
    """Select `value` in the `<select>` at `selector`, once it offers it."""
    from selenium.webdriver.support.ui import Select

    def chosen(driver: Any) -> bool:
        select = Select(css(driver, selector)[0])
        select.select_by_value(value)
        return select.first_selected_option.get_attribute("value") == value

    wait_until(driver, f"{value} offered", chosen)  # not offered yet: NoSuchElement, retried


def chat_runner(state: dict[str, Any]) -> str:
    [instance] = [i for i in state["instances"].values() if i["model"]["model_id"] == CHAT_MODEL]
    [assignment] = instance["assignments"]
    return str(assignment["runner_id"])


def open_page(driver: Any, node: ClusterNode, nodes: int) -> None:
    driver.get(f"{node.url}/")
    wait_until(driver, "the live feed", lambda d: css(d, '#connection[data-state="live"]'))
    wait_until(driver, f"{nodes} nodes", lambda d: len(css(d, "#nodes .node")) == nodes)


def shown_master(driver: Any) -> str:
    return str(css(driver, "#session")[0].get_attribute("data-master-id"))


def screenshot(driver: Any, name: str) -> None:
    directory = os.environ.get(SCREENSHOTS_ENV)
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(directory) / name))


def assert_no_console_errors(driver: Any) -> None:
    errors = console_errors(driver)
    assert not errors, json.dumps(errors, indent=1)


def test_the_page_shows_every_node_its_links_and_the_master(
    cluster: list[ClusterNode], browser: Any
) -> None:
    n0, n1, n2 = cluster
    open_page(browser, n1, 3)
    assert {card.get_attribute("data-node-id") for card in css(browser, "#nodes .node")} == {
        node.node_id for node in cluster
    }
    masters = css(browser, '#nodes .node[data-master="true"]')
    assert [card.get_attribute("data-node-id") for card in masters] == [n0.node_id]
    assert "master" in masters[0].text
    [own] = css(browser, '#nodes .node[data-self="true"]')
    assert own.get_attribute("data-node-id") == n1.node_id
    assert shown_master(browser) == n0.node_id
    # Every node reports its links; three nodes linked pairwise are three lines.
    wait_until(browser, "3 links", lambda d: len(css(d, "#topology line.link")) == 3)
    # Each node's memory, and the chat model's runner where it runs (n2).
    cards = {c.get_attribute("data-node-id"): c.text for c in css(browser, "#nodes .node")}
    assert all(" used" in text for text in cards.values())
    assert f"{CHAT_MODEL} · ready" in cards[n2.node_id]
    assert_no_console_errors(browser)


def test_an_instance_placed_from_the_page_becomes_ready_and_goes_when_deleted(
    cluster: list[ClusterNode], browser: Any
) -> None:
    _, n1, n2 = cluster
    runners_before = {n1.name: n1.runner_pids(), n2.name: n2.runner_pids()}
    open_page(browser, n1, 3)
    click(browser, "the catalog's Place button", f'#catalog tr[data-model="{SPLIT_MODEL}"] .place')
    # Choose the pipeline over n1 and n2 among the previews (in either rank order).
    pair = {n1.node_id, n2.node_id}

    def pipeline_over_n1_n2(driver: Any) -> Any:
        for button in css(driver, '#preview-list button[data-sharding="pipeline"]'):
            if set(str(button.get_attribute("data-node-ids")).split(",")) == pair:
                return button
        return None

    choice = wait_until(browser, "a pipeline preview over n1 and n2", pipeline_over_n1_n2)
    assert choice.is_enabled()
    choice.click()
    ready = f'.instance[data-model="{SPLIT_MODEL}"][data-status="ready"]'
    card = wait_until(browser, f"{SPLIT_MODEL} ready", lambda d: css(d, ready))[0]
    instance_id = card.get_attribute("data-instance-id")
    # The picture, in rank order: each node holds a contiguous range of the 4 layers.
    rows = css(card, ".rank")
    holders = [row.get_attribute("data-node-id") for row in rows]
    bounds = [(int(r.get_attribute("data-start")), int(r.get_attribute("data-end"))) for r in rows]
    assert set(holders) == pair
    assert bounds[0][0] == 0 and bounds[0][1] == bounds[1][0] and bounds[1][1] == 4
    # The same as the public API has it.
    [placed] = [i for i in n1.get("/instances")["data"] if i["instance_id"] == instance_id]
    assert [a["node_id"] for a in placed["assignments"]] == holders
    screenshot(browser, "dashboard.png")

    click(browser, "its Delete button", f'.instance[data-instance-id="{instance_id}"] .delete')
    wait_until(
        browser,
        "the instance gone from the page",
        lambda d: not css(d, f'.instance[data-instance-id="{instance_id}"]'),
    )
    assert instance_id not in n1.get("/state")["instances"]
    wait_for(
        "its runners stopped",
        lambda: {n1.name: n1.runner_pids(), n2.name: n2.runner_pids()} == runners_before,
    )
    assert_no_console_errors(browser)


def test_a_chat_streams_and_stop_ends_the_generation_in_the_runner(
    cluster: list[ClusterNode], browser: Any
) -> None:
    _, n1, _ = cluster
    open_page(browser, n1, 3)
    choose(browser, "#chat-model", CHAT_MODEL)
    tokens = css(browser, "#chat-max-tokens")[0]
    tokens.clear()
    tokens.send_keys(str(LONG_ANSWER_TOKENS))
    css(browser, "#chat-input")[0].send_keys("Tell me about the cluster.")
    click(browser, "Send", "#chat-send")
    started = time.monotonic()

    def answer_length(driver: Any) -> int:
        return len(css(driver, ".turn.assistant")[0].text)

    first = wait_until(browser, "the first text", answer_length)
    wait_until(browser, "more text, streamed", lambda d: answer_length(d) > first + 10)
    assert css(browser, "#chat-status")[0].get_attribute("data-state") == "streaming"
    [task] = n1.get("/state")["tasks"].values()  # it is running in the cluster

    click(browser, "Stop", "#chat-stop")
    wait_until(
        browser,
        "the chat stopped",
        lambda d: css(d, "#chat-status")[0].get_attribute("data-state") == "stopped",
    )
    stopped_at = answer_length(browser)

    def generation_over() -> bool:
        state = n1.get("/state")
        runner = state["runners"][chat_runner(state)]
        return not state["tasks"] and runner["status"]["type"] == "RunnerReady"

    wait_for("the runner idle again", generation_over, timeout=30.0)
    # Far sooner than the 50 s the whole answer takes: the runner stopped generating.
    assert time.monotonic() - started < LONG_ANSWER_TOKENS * STEP_DELAY_S / 2
    assert task["task_id"].startswith("chatcmpl-")
    assert answer_length(browser) == stopped_at
    assert css(browser, ".turn.assistant")[0].get_attribute("data-streaming") == "false"
    screenshot(browser, "dashboard-chat.png")
    assert_no_console_errors(browser)


def test_killing_the_master_shows_the_new_master(cluster: list[ClusterNode], browser: Any) -> None:
    """Last: it kills n0. The page (from n1) and a script following /state/events both see
    the new session; the page then still works (a chat through n1)."""
    n0, n1, n2 = cluster
    open_page(browser, n1, 3)
    assert shown_master(browser) == n0.node_id
    with httpx.stream("GET", f"{n1.url}/state/events", timeout=30.0) as events:
        lines = events.iter_lines()
        first = next_event(lines)
        assert first["session"]["master_id"] == n0.node_id
        n0.kill()
        killed = time.monotonic()
        while (event := next_event(lines))["session"] in (None, first["session"]):
            pass
        script_saw = time.monotonic() - killed
    new_master = event["session"]["master_id"]
    assert new_master in {n1.node_id, n2.node_id}
    assert event["session"]["clock"] > first["session"]["clock"]

    wait_until(browser, "the new master", lambda d: shown_master(d) == new_master)
    wait_until(browser, "n0 gone", lambda d: len(css(d, "#nodes .node")) == 2, SHOWN_WITHIN_S)
    page_saw = time.monotonic() - killed
    assert page_saw < SHOWN_WITHIN_S, page_saw
    [card] = css(browser, '#nodes .node[data-master="true"]')
    assert card.get_attribute("data-node-id") == new_master
    assert any("(was" in item.text for item in css(browser, "#changes li"))
    print(f"failover shown: by /state/events {script_saw:.2f} s, on the page {page_saw:.2f} s")
    screenshot(browser, "dashboard-failover.png")

    # The page keeps working: a chat through n1 still streams to its end.
    css(browser, "#chat-input")[0].send_keys("Still there?")
    tokens = css(browser, "#chat-max-tokens")[0]
    tokens.clear()
    tokens.send_keys("5")
    click(browser, "Send", "#chat-send")
    wait_until(
        browser,
        "the chat done",
        lambda d: css(d, "#chat-status")[0].get_attribute("data-state") == "done",
    )
    assert css(browser, ".turn.assistant")[0].text
    assert_no_console_errors(browser)


def next_event(lines: Iterator[str]) -> dict[str, Any]:
    """The next `data:` event of a `/state/events` stream."""
    for line in lines:
        if line.startswith("data: "):
            event: dict[str, Any] = json.loads(line.removeprefix("data: "))
            return event
    raise AssertionError("the event stream ended")
