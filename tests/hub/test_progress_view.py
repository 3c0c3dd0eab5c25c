"""The download progress a person sees: a bar on a terminal, log lines elsewhere."""

from __future__ import annotations

import io
import logging

import pytest
import trio
from rich.console import Console

from trexo.config import HubConfig
from trexo.hub.downloads import Downloads
from trexo.hub.progress_view import show_download
from trexo.hub.resolve import resolve_model

from .fake_hub import FakeHub
from .repos import TIED

TIMEOUT_S = 60.0


async def test_a_terminal_gets_a_bar_that_ends_at_the_whole_size(
    hub: FakeHub, hub_config: HubConfig, downloads: Downloads
) -> None:
    hub.rate = 2_000_000
    model = await trio.to_thread.run_sync(resolve_model, TIED, hub_config)
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=140)
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(show_download, downloads, TIED, console)
            await downloads.fetch(model)
    drawn = screen.getvalue()
    assert TIED in drawn
    assert "3.4/3.4 MiB" in drawn  # the last frame: every byte of the model's files


async def test_elsewhere_it_logs_how_far_the_download_is(
    hub: FakeHub,
    hub_config: HubConfig,
    downloads: Downloads,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("trexo.hub.progress_view.LOG_EVERY_S", 0.2)
    caplog.set_level(logging.INFO, logger="trexo.hub.progress_view")
    hub.rate = 2_000_000
    model = await trio.to_thread.run_sync(resolve_model, TIED, hub_config)
    console = Console(file=io.StringIO(), force_terminal=False)
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(show_download, downloads, TIED, console)
            await downloads.fetch(model)
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        line.startswith(f"downloading {TIED}: ") and "% of 3.4 MiB" in line for line in lines
    )
