"""Fixtures: model repositories made from the demo models, served by a fake hub on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import trio

from trexo.config import HubConfig
from trexo.hub.downloads import Downloads
from trexo.types.ids import NodeId

from .fake_hub import FakeHub, serving
from .repos import split_repo

TIED = "trexo-test/tiny-varied"
"""The varied demo model, its weights in 3 files: the embedding; layers 0-1; layers 2-3 and the
final norm (the head is tied to the embedding)."""
UNTIED = "trexo-test/tiny-untied"
"""The untied variant in 4 files: the embedding; layers 0-1; layers 2-3 and the norm; the head."""
GATED = "trexo-test/gated"
TEST_SETTINGS = {
    "retry_initial": 0.2,
    "retry_max": 0.5,
    "report_interval": 0.05,
    "chunk_bytes": 64 * 1024,  # a partial file grows in small steps: it can be cut midway
}


@pytest.fixture(scope="session")
def repo_dirs(
    varied_model: Path, untied_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("repos")
    return {
        TIED: split_repo(varied_model, root / "tied"),
        UNTIED: split_repo(untied_model, root / "untied"),
        GATED: split_repo(varied_model, root / "gated"),
    }


@pytest.fixture
def hub(repo_dirs: dict[str, Path]) -> Iterator[FakeHub]:
    with serving() as served:
        for repo_id, directory in repo_dirs.items():
            served.add(repo_id, directory, gated=repo_id == GATED)
        yield served


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
