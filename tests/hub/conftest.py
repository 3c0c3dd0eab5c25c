"""Fixtures: model repositories made from the demo models, served by a fake hub on loopback."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import trio

from trexo.config import HubConfig
from trexo.hub.downloads import Downloads
from trexo.types.ids import NodeId

from .fake_hub import FakeHub

TEST_SETTINGS = {
    "retry_initial": 0.2,
    "retry_max": 0.5,
    "report_interval": 0.05,
    "chunk_bytes": 64 * 1024,  # a partial file grows in small steps: it can be cut midway
}


@pytest.fixture
def hub_config(tmp_path: Path, hub: FakeHub) -> HubConfig:
    return HubConfig(
        cache_dir=tmp_path / "hf-cache", endpoint=hub.url, offline=False, **TEST_SETTINGS
    )


def downloads_for(config: HubConfig, tmp_path: Path) -> Downloads:
    return Downloads(NodeId("test-node"), config, log_dir=tmp_path / "logs")


@pytest.fixture
async def downloads(nursery: trio.Nursery, hub_config: HubConfig, tmp_path: Path) -> Downloads:
    service: Downloads = await nursery.start(downloads_for(hub_config, tmp_path).run)
    return service


def offline(config: HubConfig) -> HubConfig:
    return attrs.evolve(config, offline=True)
