"""The catalog scans the Hugging Face cache in its own worker thread, reads a repository again
only when its folders changed, and leaves out (only) a repository whose files are no model."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from trexo.catalog_scan import CatalogScan
from trexo.config import HubConfig, NodeConfig, Paths
from trexo.errors import NotAModel
from trexo.hub import resolve
from trexo.hub.cache import RepoCache
from trexo.node import Node
from trexo.types.models import HubRevision, ModelRef

GOOD = "org/good"
BAD = "org/bad"
LLAMA = {
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 64,
}
DEEP_CONFIG = b'{"a":' * 20_000 + b"1" + b"}" * 20_000


def commit_of(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def cache_model(root: Path, repo_id: str, config: bytes | None = None, version: str = "1") -> str:
    """A model in the cache as a finished download leaves it: `main` naming a snapshot that
    holds its config and weights."""
    cache = RepoCache(root, repo_id)
    commit = commit_of(repo_id + version)
    snapshot = cache.snapshot(commit)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_bytes(config or json.dumps(LLAMA).encode())
    (snapshot / "model.safetensors").write_bytes(b"\0" * 1000)
    cache.record_ref("main", commit)
    return commit


class ConfigReads:
    """Every `config.json` the hub code reads, and whether it was read on trio's thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on_event_loop: list[bool] = []
        read = resolve._read_config

        def recording(*args: Any) -> Any:
            self.on_event_loop.append(threading.current_thread() is threading.main_thread())
            return read(*args)

        monkeypatch.setattr(resolve, "_read_config", recording)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> ConfigReads:
    return ConfigReads(monkeypatch)


def ids(models: list[ModelRef]) -> set[str]:
    return {m.model_id for m in models}


async def test_a_listing_reads_the_last_scan_not_the_disk(
    nursery: trio.Nursery, tmp_path: Path, reads: ConfigReads
) -> None:
    root = tmp_path / "hf-cache"
    commit = cache_model(root, GOOD)
    scan: CatalogScan = await nursery.start(CatalogScan(root, tmp_path / "models").run)
    assert reads.on_event_loop == [False]  # read once, in the scan's thread
    for _ in range(50):
        listed = {m.model_id: m for m in scan.hub_models()}
    model = listed[GOOD]
    assert model.source == HubRevision(GOOD, commit).source
    assert scan.on_disk(model) and scan.on_disk(ModelRef(GOOD, HubRevision(GOOD, "main").source, 1))
    assert reads.on_event_loop == [False]


async def test_a_repository_is_read_again_only_when_its_folders_change(
    nursery: trio.Nursery, tmp_path: Path, reads: ConfigReads
) -> None:
    root = tmp_path / "hf-cache"
    cache_model(root, GOOD)
    scan: CatalogScan = await nursery.start(CatalogScan(root, tmp_path / "models").run)
    await scan.rescan()
    await scan.rescan()
    assert len(reads.on_event_loop) == 1
    newer = cache_model(root, GOOD, version="2")  # a new commit: a snapshot, a ref
    await scan.rescan()
    assert len(reads.on_event_loop) == 2 and not any(reads.on_event_loop)
    (model,) = [m for m in scan.hub_models() if m.model_id == GOOD]
    assert model.source == HubRevision(GOOD, newer).source


@pytest.mark.parametrize(
    "config",
    [DEEP_CONFIG, b"[" * 20_000, b"\xff\xfe{}", b"[1, 2]", b" " * 5000 + b"{}"],
    ids=["deep", "unclosed", "not-utf8", "array", "too-large"],
)
async def test_a_hostile_config_leaves_out_its_model_only(
    nursery: trio.Nursery, tmp_path: Path, config: bytes
) -> None:
    root = tmp_path / "hf-cache"
    cache_model(root, GOOD)
    cache_model(root, BAD, config)
    scan = CatalogScan(root, tmp_path / "models", max_json_bytes=4096)
    await nursery.start(scan.run)
    assert GOOD in ids(scan.hub_models()) and BAD not in ids(scan.hub_models())
    assert "config.json" in scan.unusable()[BAD]


async def test_a_built_demo_model_is_on_disk_from_the_next_scan(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    from trexo.catalog import demo_model_ref
    from trexo.engine.demo_model import DEFAULT_DEMO_SIZE, demo_model_name

    models = tmp_path / "models"
    scan: CatalogScan = await nursery.start(CatalogScan(tmp_path / "hf-cache", models).run)
    demo = demo_model_ref()
    assert not scan.on_disk(demo)
    built = models / demo_model_name(DEFAULT_DEMO_SIZE)
    built.mkdir(parents=True)
    (built / "config.json").write_text("{}")
    await scan.rescan()
    assert scan.on_disk(demo)


async def test_model_directories_in_the_models_folder_are_listed_from_the_next_scan(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    from trexo.engine.demo_model import DEFAULT_DEMO_SIZE, demo_model_name

    models = tmp_path / "models"
    scan: CatalogScan = await nursery.start(CatalogScan(tmp_path / "hf-cache", models).run)
    assert scan.models_dir_models() == []
    for name, config in (
        ("my-llama", json.dumps(LLAMA)),
        ("broken", "{not json"),  # listed, placed whole only: no layout
        (demo_model_name(DEFAULT_DEMO_SIZE), "{}"),  # a built-in, listed as one
        (".half-built.partial", json.dumps(LLAMA)),  # being built
    ):
        (models / name).mkdir(parents=True)
        (models / name / "config.json").write_text(config)
    (models / "no-config").mkdir()
    await scan.rescan()
    listed = {m.model_id: m for m in scan.models_dir_models()}
    assert set(listed) == {"my-llama", "broken"}
    assert listed["my-llama"].source == str((models / "my-llama").resolve())
    assert listed["my-llama"].layout is not None and listed["broken"].layout is None
    assert scan.on_disk(listed["my-llama"])
    (models / "my-llama" / "config.json").unlink()
    (models / "my-llama" / "model.safetensors").write_bytes(b"")  # the folder changes
    await scan.rescan()
    assert ids(scan.models_dir_models()) == {"broken"}


# --- a node's listings ------------------------------------------------------------------------


def offline_node(tmp_path: Path) -> Node:
    hub = HubConfig(cache_dir=tmp_path / "hf-cache", offline=True)
    return Node(NodeConfig(paths=Paths(tmp_path / "data"), hub=hub))


async def test_a_nodes_listings_scan_in_a_worker_thread_and_skip_a_hostile_model(
    nursery: trio.Nursery, tmp_path: Path, reads: ConfigReads
) -> None:
    """Every listing scanned the cache on the event loop (7.5 s with a large config), and
    one hostile config made `/v1/models`, `/api/tags`, placements and previews fail."""
    root = tmp_path / "hf-cache"
    cache_model(root, GOOD)
    cache_model(root, BAD, DEEP_CONFIG)
    node = offline_node(tmp_path)
    await nursery.start(node.catalog_scan.run)
    for _ in range(20):
        listed = {listing.model.model_id: listing for listing in node.client.models()}
    assert listed[GOOD].downloaded and BAD not in listed
    assert (await node.client.resolve_model(GOOD)).model_id == GOOD
    with pytest.raises(NotAModel, match=r"config\.json"):
        await node.client.resolve_model(BAD)
    assert reads.on_event_loop and not any(reads.on_event_loop)
