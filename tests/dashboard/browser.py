"""Headless Chromium driven by Selenium, for the dashboard's tests.

The browser is Debian's `chromium` with its `chromium-driver` (`.ci/run` installs both):
nothing is downloaded at test time. Where either is missing, the tests skip and say so.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest

from tests.waiting import NotYet, WaitTimedOut, wait_until_sync

T = TypeVar("T")

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
DRIVERS = ("chromedriver",)
WINDOW = (1400, 1000)
WAIT_TIMEOUT_S = 60.0
"""Generous: a test machine shared with other test runs is slow by turns."""
SEVERE = "SEVERE"
PAGE_POLL_S = 0.05
"""How often a wait looks at the page: each look is a round trip through chromedriver."""


def find_executables() -> tuple[str, str]:
    """The browser's and its driver's paths; skips the test where either is missing."""
    browser = next(filter(None, map(shutil.which, BROWSERS)), None)
    driver = next(filter(None, map(shutil.which, DRIVERS)), None)
    if browser is None or driver is None:
        missing = " and ".join(
            what for what, path in (("chromium", browser), ("chromedriver", driver)) if not path
        )
        pytest.skip(
            f"no {missing} on PATH: the dashboard's browser tests need Debian's `chromium` "
            "and `chromium-driver` (apt-get install chromium chromium-driver)"
        )
    return browser, driver


@contextmanager
def headless_chromium() -> Iterator[Any]:
    """A fresh headless Chromium that keeps the page's console log; quit (and reaped) after."""
    pytest.importorskip("selenium", reason="selenium is in trexo's `test` extra")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = find_executables()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in (
        "--headless=new",
        "--no-sandbox",  # tests run as root in containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: Any) -> list[dict[str, Any]]:
    """The page's console errors since the last call (failed requests included)."""
    return [entry for entry in driver.get_log("browser") if entry["level"] == SEVERE]


def wait_on_page(
    driver: Any, check: Callable[[Any], T], *, what: str, timeout: float = WAIT_TIMEOUT_S
) -> T:
    """`wait_until_sync` for `check(driver)`, with the page's console in the message if it
    times out. The page rebuilds what changed on each event, so an element found a moment
    ago may be gone: that is retried, not an error."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    def on_page() -> T | NotYet:
        try:
            return check(driver)
        except (StaleElementReferenceException, NoSuchElementException) as exc:
            return NotYet(type(exc).__name__)

    try:
        return wait_until_sync(on_page, timeout=timeout, what=what, poll=PAGE_POLL_S)
    except WaitTimedOut as exc:
        console = json.dumps(driver.get_log("browser"), indent=1)
        raise WaitTimedOut(f"{exc}; the console: {console}") from None


SHOWN_JS = """
const [selector, names] = arguments;
return [...document.querySelectorAll(selector)].map((e) => Object.fromEntries(
  [["text", e.innerText ?? e.textContent], ...names.map((n) => [n, e.dataset[n] ?? null])]));
"""


def shown(driver: Any, selector: str, *data: str) -> list[dict[str, str | None]]:
    """What `selector` finds on the page, each as its `text` and the `data-` attributes
    named (`nodeId` for `data-node-id`), read in one go: the page rebuilds what changed on
    every event, so an element found in one call may be gone in the next."""
    found: list[dict[str, str | None]] = driver.execute_script(SHOWN_JS, selector, list(data))
    return found


def css(root: Any, selector: str) -> list[Any]:
    """What `selector` finds under `root`: the page (a driver) or an element."""
    from selenium.webdriver.common.by import By

    return list(root.find_elements(By.CSS_SELECTOR, selector))


def click(driver: Any, what: str, selector: str) -> None:
    """Click the first element `selector` finds, once it is there and enabled."""

    def clicked(driver: Any) -> bool:
        found = [e for e in css(driver, selector) if e.is_enabled()]
        if found:
            found[0].click()
        return bool(found)

    wait_on_page(driver, clicked, what=what)
