"""What the page shows for each state an instance can be in, and for an API error, in a real
browser against the real API over a scripted node (`tests/api/fake_node.py`): statuses a
live cluster shows only for a moment (loading, downloading, failed) held still."""

from __future__ import annotations

import json
from typing import Any

import attrs
import trio

from tests.api.fake_node import DEMO, NODE_ID, TOO_BIG, FakeNode
from trexo.api.app import create_app
from trexo.api.server import ApiServer
from trexo.config import ApiConfig
from trexo.types.downloads import DownloadPhase, DownloadProgress
from trexo.types.ids import InstanceId, RunnerId
from trexo.types.runner_status import (
    RunnerDownloading,
    RunnerFailed,
    RunnerLoading,
    RunnerReady,
    RunnerStatus,
)
from trexo.types.state import Instance, RunnerAssignment, RunnerRecord, State

from .browser import (
    click,
    console_errors,
    find_executables,
    headless_chromium,
    shown,
    wait_on_page,
)

STATUSES: dict[str, RunnerStatus] = {
    "loading": RunnerLoading(0.4),
    "downloading": RunnerDownloading(),
    "failed": RunnerFailed("exit code 1 (out of memory?)"),
    "ready": RunnerReady(),
}
"""Each instance's one runner, by the status the page must show for it."""
DOWNLOAD = DownloadProgress(DEMO.model_id, DownloadPhase.DOWNLOADING, 41, 100, bytes_per_s=10)


def with_instances(state: State, statuses: dict[str, RunnerStatus]) -> State:
    instances, runners = {}, {}
    for name, status in statuses.items():
        instance_id, runner_id = InstanceId(f"inst-{name}"), RunnerId(f"run-{name}")
        instances[instance_id] = Instance(
            instance_id, DEMO, (RunnerAssignment(runner_id, NODE_ID),)
        )
        runners[runner_id] = RunnerRecord(runner_id, instance_id, NODE_ID, status)
    downloads = {NODE_ID: {DEMO.model_id: DOWNLOAD}}
    return attrs.evolve(state, instances=instances, runners=runners, downloads=downloads)


async def test_every_status_live_and_an_api_error_as_a_message(nursery: trio.Nursery) -> None:
    find_executables()  # skips here, before anything starts, where there is no browser
    node = FakeNode()
    node.state = with_instances(node.state, STATUSES)
    config = ApiConfig(port=0)
    url = await nursery.start(ApiServer(create_app(node, config), config).run)

    def shown_statuses(driver: Any) -> dict[str, str | None]:
        cards = shown(driver, ".instance", "instanceId", "status")
        return {str(card["instanceId"]): card["status"] for card in cards}

    def card_text(driver: Any, name: str) -> str:
        return str(shown(driver, f'.instance[data-instance-id="inst-{name}"]')[0]["text"])

    def drive() -> None:  # in a thread: Selenium blocks, and the API runs in this trio run
        with headless_chromium() as driver:
            driver.get(f"{url}/")
            expected = {f"inst-{name}": name for name in STATUSES}
            wait_on_page(driver, lambda d: shown_statuses(d) == expected, what="every status")
            assert "loading 40%" in card_text(driver, "loading")
            assert "41% of 100 B" in card_text(driver, "downloading")
            assert "failed: exit code 1 (out of memory?)" in card_text(driver, "failed")
            assert "41% of 100 B" in str(
                shown(driver, f'.node[data-node-id="{NODE_ID}"]')[0]["text"]
            )

            # Live: the loading runner becomes ready, and the page follows.
            ready = {**STATUSES, "loading": RunnerReady()}
            trio.from_thread.run_sync(
                lambda: setattr(node, "state", with_instances(node.state, ready))
            )
            wait_on_page(
                driver,
                lambda d: shown_statuses(d)["inst-loading"] == "ready",
                what="loading -> ready",
            )

            # An error from the API is a message on the page, not swallowed.
            click(
                driver, "Place… of the too big model", f'tr[data-model="{TOO_BIG.model_id}"] .place'
            )
            click(driver, "Let the master choose", '#preview-list button[data-sharding="auto"]')
            [error] = wait_on_page(
                driver, lambda d: shown(d, '.message[data-kind="error"]'), what="the error"
            )
            assert f"placing {TOO_BIG.model_id}: " in str(error["text"])
            assert "needs more memory than the cluster has" in str(error["text"])
            # The browser logs the refused request itself; nothing else went wrong.
            errors = console_errors(driver)
            assert [("400" in e["message"], e["source"]) for e in errors] == [(True, "network")], (
                json.dumps(errors, indent=1)
            )

    with trio.fail_after(120):
        await trio.to_thread.run_sync(drive)


async def test_placing_again_after_a_503_goes_under_the_same_key(nursery: trio.Nursery) -> None:
    # A 503 placement may still be carried out: the page's retry must not place a second.
    find_executables()
    node = FakeNode()
    node.no_session = True
    config = ApiConfig(port=0)
    url = await nursery.start(ApiServer(create_app(node, config), config).run)

    def place_from_the_page(driver: Any) -> None:
        click(driver, "Place… of the demo model", f'tr[data-model="{DEMO.model_id}"] .place')
        click(driver, "Let the master choose", '#preview-list button[data-sharding="auto"]')

    def drive() -> None:
        with headless_chromium() as driver:
            driver.get(f"{url}/")
            place_from_the_page(driver)
            wait_on_page(driver, lambda d: shown(d, '.message[data-kind="error"]'), what="the 503")
            trio.from_thread.run_sync(lambda: setattr(node, "no_session", False))
            place_from_the_page(driver)
            wait_on_page(driver, lambda d: len(node.idempotency_keys) == 2, what="the retry")
            place_from_the_page(driver)  # answered: a new placement is a new key
            wait_on_page(driver, lambda d: len(node.idempotency_keys) == 3, what="another")

    with trio.fail_after(120):
        await trio.to_thread.run_sync(drive)
    first, retry, another = node.idempotency_keys
    assert first is not None and retry == first and another not in (None, first)
    assert len(node.placements) == 2  # the scripted node placed nothing on the 503
