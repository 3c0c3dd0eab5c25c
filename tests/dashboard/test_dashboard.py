"""The dashboard in a real browser (headless Chromium) against a real 3-node cluster.

The three nodes start at once and elect whichever they elect; the page is loaded from one
follower, the chat model runs on the other, so a chat from the page crosses nodes. The
tests run in this order and share the cluster: the last one kills the master. Runners
generate slowly here (a test hook delays every decode step), so a chat can be stopped
midway.

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

import attrs
import httpx
import pytest

from tests.waiting import wait_until_sync
from trexo.runner.hooks import HOOKS_ENV

from .browser import click, console_errors, css, headless_chromium, shown, wait_on_page
from .cluster import WAIT_TIMEOUT_S, ClusterNode, shared_cluster

CHAT_MODEL = "trexo-demo-tiny"
SPLIT_MODEL = "trexo-demo-tiny-varied"
STEP_DELAY_S = 0.05
"""Per decode step: a 1000-token answer would take 50 s, so a stop is plainly early."""
LONG_ANSWER_TOKENS = 1000
SHOWN_WITHIN_S = 5.0
"""How soon the page must show a failover: measured ~0.2 s here; generous for loaded machines."""
SCREENSHOTS_ENV = "TREXO_DASHBOARD_SCREENSHOTS"


@attrs.frozen
class Roles:
    """The shared cluster's nodes, by what the tests do with them."""

    master: ClusterNode
    """Killed by the last test."""
    page: ClusterNode
    """A follower the page is loaded from."""
    chat: ClusterNode
    """The other follower: it runs the chat model."""

    @property
    def nodes(self) -> tuple[ClusterNode, ...]:
        return (self.master, self.page, self.chat)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Roles]:
    root = tmp_path_factory.mktemp("dashboard")
    env = {HOOKS_ENV: f"step_delay={STEP_DELAY_S}"}
    with shared_cluster(root, 3, "--no-model", env=env) as nodes:
        master_id = nodes[0].get("/health")["session"]["master_id"]
        [master] = [node for node in nodes if node.node_id == master_id]
        page, chat = (node for node in nodes if node is not master)
        placed = httpx.post(
            f"{page.url}/instances",
            json={"model": CHAT_MODEL, "node_id": chat.node_id},
            timeout=30.0,
        )
        assert placed.status_code == 201, placed.text
        wait_until_sync(
            lambda: model_ready(page, CHAT_MODEL),
            timeout=WAIT_TIMEOUT_S,
            what=f"{CHAT_MODEL} ready",
        )
        yield Roles(master, page, chat)


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

    wait_on_page(driver, chosen, what=f"{value} offered")  # not offered yet: NoSuchElement, retried


def chat_runner(state: dict[str, Any]) -> str:
    [instance] = [i for i in state["instances"].values() if i["model"]["model_id"] == CHAT_MODEL]
    [assignment] = instance["assignments"]
    return str(assignment["runner_id"])


def open_page(driver: Any, node: ClusterNode, nodes: int) -> None:
    driver.get(f"{node.url}/")
    wait_on_page(driver, lambda d: shown(d, '#connection[data-state="live"]'), what="the live feed")
    wait_on_page(driver, lambda d: len(shown(d, "#nodes .node")) == nodes, what=f"{nodes} nodes")


def answer_length(driver: Any) -> int:
    return len(str(shown(driver, ".turn.assistant")[0]["text"]))


def stream_a_long_answer(driver: Any) -> float:
    """Ask the chat model for a long answer and wait until it streams; when it was sent."""
    choose(driver, "#chat-model", CHAT_MODEL)
    tokens = css(driver, "#chat-max-tokens")[0]
    tokens.clear()
    tokens.send_keys(str(LONG_ANSWER_TOKENS))
    css(driver, "#chat-input")[0].send_keys("Tell me about the cluster.")
    click(driver, "Send", "#chat-send")
    started = time.monotonic()
    first = wait_on_page(driver, answer_length, what="the first text")
    wait_on_page(driver, lambda d: answer_length(d) > first + 10, what="more text, streamed")
    return started


def chat_state(driver: Any) -> str | None:
    return shown(driver, "#chat-status", "state")[0]["state"]


def shown_master(driver: Any) -> str:
    return str(shown(driver, "#session", "masterId")[0]["masterId"])


def screenshot(driver: Any, name: str) -> None:
    directory = os.environ.get(SCREENSHOTS_ENV)
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(directory) / name))


def assert_no_console_errors(driver: Any) -> None:
    errors = console_errors(driver)
    assert not errors, json.dumps(errors, indent=1)


def test_the_page_shows_every_node_its_links_and_the_master(cluster: Roles, browser: Any) -> None:
    open_page(browser, cluster.page, 3)
    cards = shown(browser, "#nodes .node", "nodeId", "master", "self")
    assert {card["nodeId"] for card in cards} == {node.node_id for node in cluster.nodes}
    [master] = [card for card in cards if card["master"] == "true"]
    assert master["nodeId"] == cluster.master.node_id
    assert "master" in str(master["text"])
    [own] = [card for card in cards if card["self"] == "true"]
    assert own["nodeId"] == cluster.page.node_id
    assert shown_master(browser) == cluster.master.node_id
    # Every node reports its links; three nodes linked pairwise are three lines.
    wait_on_page(browser, lambda d: len(shown(d, "#topology line.link")) == 3, what="3 links")
    # Each node's memory, and the chat model's runner where it runs.
    texts = {card["nodeId"]: str(card["text"]) for card in shown(browser, "#nodes .node", "nodeId")}
    assert all(" used" in text for text in texts.values())
    assert f"{CHAT_MODEL} · ready" in texts[cluster.chat.node_id]
    assert_no_console_errors(browser)


def test_an_instance_placed_from_the_page_becomes_ready_and_goes_when_deleted(
    cluster: Roles, browser: Any
) -> None:
    """Split over the two followers (in either rank order), chosen among the previews."""
    page, chat = cluster.page, cluster.chat
    runners_before = {page.name: page.runner_pids(), chat.name: chat.runner_pids()}
    open_page(browser, page, 3)
    click(browser, "the catalog's Place button", f'#catalog tr[data-model="{SPLIT_MODEL}"] .place')
    a, b = page.node_id, chat.node_id
    pipeline = '#preview-list button[data-sharding="pipeline"]'
    click(
        browser,
        "the pipeline preview over the two",
        f'{pipeline}[data-node-ids="{a},{b}"], {pipeline}[data-node-ids="{b},{a}"]',
    )
    ready = f'.instance[data-model="{SPLIT_MODEL}"][data-status="ready"]'
    [card] = wait_on_page(
        browser, lambda d: shown(d, ready, "instanceId"), what=f"{SPLIT_MODEL} ready"
    )
    instance_id = card["instanceId"]
    # The picture, in rank order: each node holds a contiguous range of the 4 layers.
    rows = shown(
        browser, f'.instance[data-instance-id="{instance_id}"] .rank', "nodeId", "start", "end"
    )
    holders = [row["nodeId"] for row in rows]
    bounds = [(int(str(row["start"])), int(str(row["end"]))) for row in rows]
    assert set(holders) == {a, b}
    assert bounds[0][0] == 0 and bounds[0][1] == bounds[1][0] and bounds[1][1] == 4
    # The same as the public API has it.
    [placed] = [i for i in page.get("/instances")["data"] if i["instance_id"] == instance_id]
    assert [a["node_id"] for a in placed["assignments"]] == holders
    screenshot(browser, "dashboard.png")

    click(browser, "its Delete button", f'.instance[data-instance-id="{instance_id}"] .delete')
    wait_on_page(
        browser,
        lambda d: not shown(d, f'.instance[data-instance-id="{instance_id}"]'),
        what="the instance gone from the page",
    )
    assert instance_id not in page.get("/state")["instances"]
    wait_until_sync(
        lambda: {page.name: page.runner_pids(), chat.name: chat.runner_pids()} == runners_before,
        timeout=WAIT_TIMEOUT_S,
        what="its runners stopped",
    )
    assert_no_console_errors(browser)


def test_a_chat_streams_and_stop_ends_the_generation_in_the_runner(
    cluster: Roles, browser: Any
) -> None:
    page = cluster.page
    open_page(browser, page, 3)
    started = stream_a_long_answer(browser)
    assert chat_state(browser) == "streaming"
    [task] = page.get("/state")["tasks"].values()  # it is running in the cluster

    click(browser, "Stop", "#chat-stop")
    wait_on_page(browser, lambda d: chat_state(d) == "stopped", what="the chat stopped")
    stopped_at = answer_length(browser)

    def generation_over() -> bool:
        state = page.get("/state")
        runner = state["runners"][chat_runner(state)]
        return not state["tasks"] and runner["status"]["type"] == "RunnerReady"

    wait_until_sync(generation_over, timeout=30.0, what="the runner idle again")
    # Far sooner than the 50 s the whole answer takes: the runner stopped generating.
    assert time.monotonic() - started < LONG_ANSWER_TOKENS * STEP_DELAY_S / 2
    assert task["task_id"].startswith("chatcmpl-")
    assert answer_length(browser) == stopped_at
    assert shown(browser, ".turn.assistant", "streaming")[0]["streaming"] == "false"
    screenshot(browser, "dashboard-chat.png")
    assert_no_console_errors(browser)


def test_killing_the_master_shows_the_new_master(cluster: Roles, browser: Any) -> None:
    """Last: it kills the master. The page and a script following /state/events both see
    the new session; the page then still works (a chat through its node)."""
    master, page = cluster.master, cluster.page
    open_page(browser, page, 3)
    assert shown_master(browser) == master.node_id
    with httpx.stream("GET", f"{page.url}/state/events", timeout=30.0) as events:
        lines = events.iter_lines()
        first = next_event(lines)
        assert first["session"]["master_id"] == master.node_id
        master.kill()
        killed = time.monotonic()
        while (event := next_event(lines))["session"] in (None, first["session"]):
            pass
        script_saw = time.monotonic() - killed
    new_master = event["session"]["master_id"]
    assert new_master in {page.node_id, cluster.chat.node_id}
    assert event["session"]["clock"] > first["session"]["clock"]

    wait_on_page(browser, lambda d: shown_master(d) == new_master, what="the new master")
    wait_on_page(
        browser,
        lambda d: len(shown(d, "#nodes .node")) == 2,
        what="the master gone",
        timeout=SHOWN_WITHIN_S,
    )
    page_saw = time.monotonic() - killed
    assert page_saw < SHOWN_WITHIN_S, page_saw
    [card] = shown(browser, '#nodes .node[data-master="true"]', "nodeId")
    assert card["nodeId"] == new_master
    assert any("(was" in str(item["text"]) for item in shown(browser, "#changes li"))
    print(f"failover shown: by /state/events {script_saw:.2f} s, on the page {page_saw:.2f} s")
    screenshot(browser, "dashboard-failover.png")

    # The page keeps working: a chat through its node still streams to its end.
    css(browser, "#chat-input")[0].send_keys("Still there?")
    tokens = css(browser, "#chat-max-tokens")[0]
    tokens.clear()
    tokens.send_keys("5")
    click(browser, "Send", "#chat-send")
    wait_on_page(browser, lambda d: chat_state(d) == "done", what="the chat done")
    assert shown(browser, ".turn.assistant")[0]["text"]
    assert_no_console_errors(browser)


def next_event(lines: Iterator[str]) -> dict[str, Any]:
    """The next `data:` event of a `/state/events` stream."""
    for line in lines:
        if line.startswith("data: "):
            event: dict[str, Any] = json.loads(line.removeprefix("data: "))
            return event
    raise AssertionError("the event stream ended")
