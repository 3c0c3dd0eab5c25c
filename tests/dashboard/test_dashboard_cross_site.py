"""Web pages of other origins cannot use a node, in a real browser: a page served from
another port of 127.0.0.1 tries to place an instance and to chat on the node (a simple
`text/plain` POST, a form-encoded POST, a `<form>` submitted as `text/plain` forging a JSON
chat, and a JSON POST) and to have it ask the hub about a model (an image whose address is
a placement preview), and changes nothing, while the node's own dashboard still places an
instance and chats. The node is the real API over a scripted node (`tests/api/fake_node.py`).

And the page keeps drawing when a node reports an `api_url` that is not a URL."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
import pytest
import trio

from tests.api.fake_node import DEMO, NODE_ID, FakeNode
from tests.waiting import NotYet
from trexo.api.app import create_app
from trexo.api.server import ACCESS_LOGGER, ApiServer
from trexo.config import ApiConfig
from trexo.types.ids import NodeId
from trexo.types.state import NodeInfo

from .browser import click, find_executables, headless_chromium, shown, wait_on_page

BROWSER_BOUND_S = 180.0
"""Generous: Chromium starts in seconds, but the machines that run tests are shared."""

ATTACKS = {
    "text/plain place": ("/instances", "text/plain", {"model": DEMO.model_id}),
    "form place": (
        "/instances",
        "application/x-www-form-urlencoded",
        {"model": DEMO.model_id},
    ),
    "text/plain chat": (
        "/v1/chat/completions",
        "text/plain",
        {"model": DEMO.model_id, "messages": [{"role": "user", "content": "hi"}]},
    ),
    "text/plain ollama chat": (
        "/api/chat",
        "text/plain",
        {"model": DEMO.model_id, "messages": [{"role": "user", "content": "hi"}]},
    ),
    "json place": ("/instances", "application/json", {"model": DEMO.model_id}),
    "json chat": (
        "/v1/chat/completions",
        "application/json",
        {"model": DEMO.model_id, "messages": [{"role": "user", "content": "hi"}]},
    ),
}
"""What the other page sends with `fetch`: its name, path, content type and body. The
simple ones go without asking (`no-cors`); the JSON ones need a CORS preflight first."""

ATTACK_PAGE = """<!doctype html>
<meta charset="utf-8"><title>another site</title>
<iframe name="sink" id="sink"></iframe>
<form id="form" method="post" target="sink" enctype="text/plain"
  action="NODE/v1/chat/completions">
  <input name='{"model": "MODEL", "messages": [{"role": "user", "content": "'
    value='"}]}'>
</form>
<script>
const node = "NODE";
const attacks = ATTACKS;
window.results = {};
(async () => {
  for (const [name, [path, type, body]] of Object.entries(attacks)) {
    const simple = type !== "application/json";
    try {
      const response = await fetch(node + path, {
        method: "POST", mode: simple ? "no-cors" : "cors",
        headers: { "Content-Type": type }, body: JSON.stringify(body),
      });
      window.results[name] = `answered (${response.type} ${response.status})`;
    } catch (error) {
      window.results[name] = `failed (${error.name})`;
    }
  }
  // A GET that does something (a preview asks the hub about the model), sent with no
  // Origin: an image.
  const image = new Image();
  image.onload = () => { window.results["preview image"] = "loaded"; };
  image.onerror = () => { window.results["preview image"] = "failed"; };
  image.src = node + "/instances/previews?model=MODEL";
  // The classic cross-site form: `text/plain` fields that read as JSON on the other end.
  document.getElementById("sink").addEventListener("load", () => {
    window.results["text/plain form"] = "submitted";
  });
  document.getElementById("form").submit();
})();
</script>
"""


@contextmanager
def serve_page(html: str) -> Iterator[str]:
    """`html` at `/` of a tiny HTTP server on another port of 127.0.0.1: another origin."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, name="other-origin-page")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


class AccessLog(logging.Handler):
    """The node's access log lines (method, path and status of every request it answered)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def answered(self, method: str, path: str) -> list[str]:
        """The statuses of the answers to `method path`. A line with no status ("-") is
        hypercorn noticing the client close while it finishes the answer, which it then
        logs again with its status: skipped."""
        request = f'"{method} {path} 1.1"'
        statuses = [line.split(request, 1)[1].split()[0] for line in self.lines if request in line]
        return [status for status in statuses if status.isdigit()]


@contextmanager
def access_log() -> Iterator[AccessLog]:
    logger = logging.getLogger(ACCESS_LOGGER)
    handler, level = AccessLog(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def start_api(nursery: trio.Nursery, node: FakeNode) -> str:
    config = ApiConfig(port=0)
    url: str = await nursery.start(ApiServer(create_app(node, config), config).run)
    return url


async def test_a_page_of_another_origin_cannot_place_or_chat(nursery: trio.Nursery) -> None:
    find_executables()  # skips here, before anything starts, where there is no browser
    node = FakeNode()
    url = await start_api(nursery, node)
    page = ATTACK_PAGE.replace("NODE", url).replace("MODEL", DEMO.model_id)
    page = page.replace("ATTACKS", json.dumps({name: list(a) for name, a in ATTACKS.items()}))
    expected = {*ATTACKS, "text/plain form", "preview image"}

    def results(driver: Any) -> dict[str, str] | None:
        found: dict[str, str] = driver.execute_script("return window.results ?? {}")
        return found if set(found) == expected else None

    def drive(other_origin: str, log: AccessLog) -> None:  # in a thread: Selenium blocks
        with headless_chromium() as driver:
            driver.get(f"{other_origin}/")
            tried = wait_on_page(driver, results, what="every attempt of the other page")
            # The simple requests reached the node (and were refused); the JSON ones never
            # got past their preflight.
            assert tried["json place"] == "failed (TypeError)", tried
            assert tried["json chat"] == "failed (TypeError)", tried
            refused = {
                ("POST", "/instances"): ["403"] * 2,
                ("POST", "/v1/chat/completions"): ["403"] * 2,
                ("POST", "/api/chat"): ["403"],
                ("GET", "/instances/previews"): ["403"],  # the log leaves out the query
            }
            wait_on_page(  # a line is logged once its answer has gone out
                driver,
                lambda _: (
                    {request: log.answered(*request) for request in refused} == refused
                    or NotYet(log.lines)
                ),
                what="the refusals in the access log",
            )
            assert trio.from_thread.run_sync(lambda: (node.placements, node.requests)) == (
                [],
                [],
            )

            # The node's own page still places an instance and chats.
            driver.get(f"{url}/")
            click(driver, "Place… of the demo model", f'tr[data-model="{DEMO.model_id}"] .place')
            click(driver, "Let the master choose", '#preview-list button[data-sharding="auto"]')
            wait_on_page(
                driver,
                lambda d: len(shown(d, ".instance")) == 2,
                what="the instance placed from the page",
            )
            chat_from_the_page(driver)
            assert trio.from_thread.run_sync(lambda: len(node.placements)) == 1

    with access_log() as log, serve_page(page) as other_origin, trio.fail_after(BROWSER_BOUND_S):
        await trio.to_thread.run_sync(drive, other_origin, log)


def chat_from_the_page(driver: Any) -> None:
    from selenium.webdriver.support.ui import Select

    def chosen(driver: Any) -> bool:
        select = Select(driver.find_element("css selector", "#chat-model"))
        select.select_by_value(DEMO.model_id)
        return select.first_selected_option.get_attribute("value") == DEMO.model_id

    wait_on_page(driver, chosen, what="the demo model offered for a chat")
    tokens = driver.find_element("css selector", "#chat-max-tokens")
    tokens.clear()
    tokens.send_keys("20")  # within the scripted node's context
    driver.find_element("css selector", "#chat-input").send_keys("hi")
    click(driver, "Send", "#chat-send")
    wait_on_page(
        driver,
        lambda d: shown(d, "#chat-status", "state")[0]["state"] == "done",
        what="the chat done",
    )
    assert "Hello world!" in str(shown(driver, ".turn.assistant")[0]["text"])


NOT_URLS = {
    NodeId("node-js"): "javascript:alert(document.domain)",
    NodeId("node-text"): "not a url",
    NodeId("node-ftp"): "ftp://files.example/",
}
GOOD_URL = "http://10.0.0.7:52415"


def without_validation(info: NodeInfo, api_url: str) -> NodeInfo:
    """`info` with an `api_url` that decoding a peer's report now refuses: what the page
    must survive anyway (a state it is given is all it knows)."""
    forged = attrs.evolve(info)
    object.__setattr__(forged, "api_url", api_url)
    return forged


@pytest.mark.parametrize("bad", sorted(NOT_URLS))
async def test_the_page_draws_nodes_whose_api_url_is_not_a_url(
    nursery: trio.Nursery, bad: NodeId
) -> None:
    find_executables()
    node = FakeNode()
    fine = NodeInfo(NodeId("node-ok"), "okhost", 2**30, 2**29, api_url=GOOD_URL)
    forged = without_validation(NodeInfo(bad, "badhost", 2**30, 2**29), NOT_URLS[bad])
    nodes = {**node.state.nodes, fine.node_id: fine, forged.node_id: forged}
    node.state = attrs.evolve(node.state, nodes=nodes)
    url = await start_api(nursery, node)

    def drive() -> None:
        with headless_chromium() as driver:
            driver.get(f"{url}/")
            wait_on_page(
                driver, lambda d: len(shown(d, "#nodes .node")) == 3, what="the three nodes"
            )
            # Everything after the node cards is drawn too: the instance, the topology.
            wait_on_page(driver, lambda d: shown(d, ".instance"), what="the instance")
            wait_on_page(
                driver, lambda d: len(shown(d, "#topology circle.dot")) == 3, what="3 dots"
            )
            links = driver.execute_script(
                "return [...document.querySelectorAll('#nodes a')].map((a) => a.href)"
            )
            assert links == [f"{GOOD_URL}/"], links
            texts = {c["nodeId"]: str(c["text"]) for c in shown(driver, "#nodes .node", "nodeId")}
            assert NOT_URLS[bad] in texts[bad]  # shown as text
            assert "badhost" in texts[bad] and NODE_ID in texts

    with trio.fail_after(BROWSER_BOUND_S):
        await trio.to_thread.run_sync(drive)
