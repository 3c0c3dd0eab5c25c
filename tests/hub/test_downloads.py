"""The Downloads service against a fake hub on loopback: real download processes, real HTTP."""

from __future__ import annotations

import hashlib
from contextlib import suppress
from pathlib import Path

import attrs
import psutil
import pytest
import trio

from tests.waiting import NotYet, wait_until
from trexo.config import HubConfig
from trexo.errors import NoDiskSpace, NotOnDisk, RepoAccessDenied, RepoNotFound
from trexo.hub.cache import RepoCache
from trexo.hub.downloads import Downloads
from trexo.hub.resolve import resolve_model
from trexo.types.downloads import DownloadPhase, DownloadProgress
from trexo.types.local_events import DownloadReport
from trexo.types.models import HubRevision, ModelRef
from trexo.types.shard import ShardSpec

from .conftest import downloads_for, offline
from .fake_hub import FakeHub
from .repos import GATED, TIED, UNTIED

TIMEOUT_S = 60.0
"""Generous: only a hang should reach it."""
SLOW_RATE = 1_000_000
"""Bytes per second: slow enough to interrupt a 1.2 MB file midway."""
BLOCKS_0 = "model-blocks-0.safetensors"


async def resolved(repo_id: str, config: HubConfig) -> ModelRef:
    return await trio.to_thread.run_sync(resolve_model, repo_id, config)


def unresolved(repo_id: str) -> ModelRef:
    return ModelRef(repo_id, HubRevision(repo_id, "main").source, 1)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def weight_names(snapshot: Path) -> set[str]:
    return {p.name for p in snapshot.iterdir() if p.name.endswith(".safetensors")}


async def wait_progress(downloads: Downloads, model_id: str, done: object) -> DownloadProgress:
    """Until `done(progress)` holds for the model's progress."""
    with trio.fail_after(TIMEOUT_S):
        while True:
            progress = downloads.progress(model_id)
            if progress is not None and done(progress):  # type: ignore[operator]
                return progress
            await downloads.wait_change()


def worker_processes() -> list[psutil.Process]:
    """The download processes running now (one that has exited, a zombie until it is
    reaped, no longer counts)."""
    running = []
    for process in psutil.Process().children(recursive=True):
        with suppress(psutil.NoSuchProcess):  # ZombieProcess is one
            if "trexo.hub.worker" in " ".join(process.cmdline()):
                running.append(process)
    return running


async def test_a_repo_resolves_to_its_commit_with_its_size_and_layout(
    hub: FakeHub, hub_config: HubConfig, repo_dirs: dict[str, Path]
) -> None:
    model = await resolved(TIED, hub_config)
    revision = model.hub_revision
    assert revision is not None and revision.commit == hub.repos[TIED].commit
    weights = sum(p.stat().st_size for p in repo_dirs[TIED].glob("*.safetensors"))
    assert model.size_bytes == weights
    assert model.layout is not None and model.layout.n_layers == 4
    # The config and the index are in the cache (the runners need them anyway).
    snapshot = RepoCache(hub_config.cache_dir, TIED).snapshot(revision.commit)
    assert {p.name for p in snapshot.iterdir()} == {"config.json", "model.safetensors.index.json"}


async def test_a_whole_model_is_fetched_checked_and_loads_as_the_original(
    downloads: Downloads, hub_config: HubConfig, repo_dirs: dict[str, Path]
) -> None:
    model = await resolved(TIED, hub_config)
    with trio.fail_after(TIMEOUT_S):
        snapshot = await downloads.fetch(model)
    originals = {p.name: p for p in repo_dirs[TIED].iterdir()}
    assert {p.name for p in snapshot.iterdir()} == set(originals)
    for path in snapshot.iterdir():
        assert path.read_bytes() == originals[path.name].read_bytes()
    progress = downloads.progress(TIED)
    assert progress is not None and progress.phase is DownloadPhase.DONE
    assert (
        progress.done_bytes
        == progress.total_bytes
        == sum(p.stat().st_size for p in originals.values())
    )
    # The facts a master would get: progress while it ran, then done.
    reports = []
    while True:
        try:
            reports.append(downloads.facts.receive_nowait())
        except trio.WouldBlock:
            break
    phases = [r.progress.phase for r in reports if isinstance(r, DownloadReport)]
    assert phases[0] is DownloadPhase.DOWNLOADING and phases[-1] is DownloadPhase.DONE


async def test_each_pipeline_rank_fetches_only_the_files_of_its_part(
    hub: FakeHub, hub_config: HubConfig, tmp_path: Path, nursery: trio.Nursery
) -> None:
    model = await resolved(UNTIED, hub_config)
    ranks = (ShardSpec(0, 2, 0, 2), ShardSpec(2, 4, 1, 2))
    wanted = (
        {"model-embed.safetensors", BLOCKS_0},
        {"model-blocks-1.safetensors", "model-head.safetensors"},
    )
    for rank, (shard, files) in enumerate(zip(ranks, wanted, strict=True)):
        config = attrs.evolve(hub_config, cache_dir=tmp_path / f"node-{rank}")
        service = await nursery.start(downloads_for(config, tmp_path / f"n{rank}").run)
        before = len(hub.downloads(UNTIED))
        with trio.fail_after(TIMEOUT_S):
            snapshot = await service.fetch(model, shard)
        assert weight_names(snapshot) == files
        fetched = {f for f in hub.downloads(UNTIED)[before:] if f.endswith(".safetensors")}
        assert fetched == files


async def test_a_stopped_download_resumes_where_it_stopped(
    hub: FakeHub, downloads: Downloads, hub_config: HubConfig
) -> None:
    model = await resolved(TIED, hub_config)
    hub.rate = SLOW_RATE
    with trio.CancelScope() as waiting:

        async def stop_midway() -> None:
            await wait_progress(downloads, TIED, lambda p: p.done_bytes > 1_500_000)
            waiting.cancel()  # the one instance that needed it is gone

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_midway)
            await downloads.fetch(model)
    stopped = await wait_progress(downloads, TIED, lambda p: p.phase is DownloadPhase.CANCELLED)
    assert 0 < stopped.done_bytes < stopped.total_bytes
    await wait_until(  # the process is ended at once, not left to finish
        lambda: not (left := worker_processes()) or NotYet(left),
        timeout=5.0,
        what="the download process ended",
    )
    cache = RepoCache(hub_config.cache_dir, TIED)
    # Files are fetched a few at a time: each of those under way left its partial file.
    kept = {p.name.split(".")[0]: p.stat().st_size for p in cache.folder.glob("blobs/*.incomplete")}
    assert kept and sum(kept.values()) > 0

    hub.rate = None
    with trio.fail_after(TIMEOUT_S):
        snapshot = await downloads.fetch(model)
    # Each interrupted file was asked for again from where it stopped, and is whole and right.
    for file in hub.repos[TIED].files.values():
        if file.etag in kept and kept[file.etag] > 0:
            assert hub.ranges(TIED, file.name) == ["", f"bytes={kept[file.etag]}-"]
            assert sha256(snapshot / file.name) == file.sha256
    assert not list(cache.folder.glob("blobs/*.incomplete"))


async def test_a_corrupt_partial_file_is_caught_and_fetched_again(
    hub: FakeHub, downloads: Downloads, hub_config: HubConfig
) -> None:
    model = await resolved(TIED, hub_config)
    file = hub.repos[TIED].files[BLOCKS_0]
    cache = RepoCache(hub_config.cache_dir, TIED)
    cache.partial(file.etag).parent.mkdir(parents=True, exist_ok=True)
    cache.partial(file.etag).write_bytes(b"\xff" * 1000)  # not the file's first bytes
    with trio.fail_after(TIMEOUT_S):
        snapshot = await downloads.fetch(model)
    assert sha256(snapshot / BLOCKS_0) == file.sha256
    # Resumed after the bad bytes, found wrong by its hash, then fetched whole.
    assert hub.ranges(TIED, BLOCKS_0) == ["bytes=1000-", ""]


async def test_two_requests_for_one_model_share_one_download(
    hub: FakeHub, downloads: Downloads, hub_config: HubConfig
) -> None:
    model = await resolved(TIED, hub_config)
    hub.rate = 4 * SLOW_RATE
    snapshots: list[Path] = []

    async def fetch() -> None:
        snapshots.append(await downloads.fetch(model))

    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fetch)
            nursery.start_soon(fetch)
    assert snapshots[0] == snapshots[1]
    weights = [f for f in hub.downloads(TIED) if f.endswith(".safetensors")]
    assert sorted(weights) == sorted(set(weights))  # each file once


async def test_unknown_and_gated_repos_are_refused_clearly(
    hub: FakeHub,
    downloads: Downloads,
    hub_config: HubConfig,
    monkeypatch: pytest.MonkeyPatch,
    nursery: trio.Nursery,
    tmp_path: Path,
) -> None:
    with pytest.raises(RepoNotFound, match="trexo-test/nope does not exist"):
        await resolved("trexo-test/nope", hub_config)
    with trio.fail_after(TIMEOUT_S), pytest.raises(RepoNotFound, match="trexo-test/nope"):
        await downloads.fetch(unresolved("trexo-test/nope"))
    # Its listing is public, its files are not: no config, so it cannot even be resolved.
    with pytest.raises(RepoAccessDenied, match=r"trexo-test/gated is a gated model.*HF_TOKEN"):
        await resolved(GATED, hub_config)
    pinned = HubRevision(GATED, hub.repos[GATED].commit)
    gated = ModelRef(GATED, pinned.source, 1)
    with trio.fail_after(TIMEOUT_S), pytest.raises(RepoAccessDenied, match="HF_TOKEN"):
        await downloads.fetch(gated)
    progress = downloads.progress(GATED)
    assert progress is not None and progress.phase is DownloadPhase.FAILED
    # A token in the environment of a node started afresh opens it.
    monkeypatch.setenv("HF_TOKEN", hub.token)
    assert (await resolved(GATED, hub_config)).hub_revision == pinned
    with_token = await nursery.start(downloads_for(hub_config, tmp_path / "token").run)
    with trio.fail_after(TIMEOUT_S):
        snapshot = await with_token.fetch(gated)
    assert "model-embed.safetensors" in weight_names(snapshot)


async def test_offline_a_node_uses_its_cache_and_names_what_is_missing(
    hub: FakeHub, hub_config: HubConfig, tmp_path: Path, nursery: trio.Nursery
) -> None:
    offline_config = offline(hub_config)
    cut_off = await nursery.start(downloads_for(offline_config, tmp_path / "off").run)
    with pytest.raises(NotOnDisk, match="not in this node's Hugging Face cache"):
        await resolved(TIED, offline_config)
    online = await nursery.start(downloads_for(hub_config, tmp_path / "on").run)
    model = await resolved(TIED, hub_config)
    rank_0 = ShardSpec(0, 2, 0, 2)
    with trio.fail_after(TIMEOUT_S):
        await online.fetch(model, rank_0)
    asked = len(hub.requests)
    # The same model; only its date differs (offline: when this node fetched its config).
    cached = await resolved(TIED, offline_config)
    assert attrs.evolve(cached, created=model.created) == model
    with trio.fail_after(TIMEOUT_S):
        assert weight_names(await cut_off.fetch(model, rank_0)) == {
            "model-embed.safetensors",
            BLOCKS_0,
        }
        with pytest.raises(NotOnDisk, match=r"model-blocks-1\.safetensors"):
            await cut_off.fetch(model)  # the whole model: rank 1's file is not here
    assert len(hub.requests) == asked  # offline means no request at all


async def test_a_hub_that_is_down_is_retried_until_it_answers(
    hub: FakeHub, downloads: Downloads, hub_config: HubConfig
) -> None:
    model = await resolved(TIED, hub_config)
    hub.unavailable = True
    async with trio.open_nursery() as nursery:
        nursery.start_soon(downloads.fetch, model)
        retrying = await wait_progress(downloads, TIED, lambda p: p.phase is DownloadPhase.RETRYING)
        assert retrying.error is not None and "503" in retrying.error
        assert retrying.retry_in is not None and retrying.retry_in > 0
        hub.unavailable = False
    done = downloads.progress(TIED)
    assert done is not None and done.phase is DownloadPhase.DONE


async def test_a_download_that_cannot_fit_the_disk_is_refused_up_front(
    hub: FakeHub, hub_config: HubConfig, tmp_path: Path, nursery: trio.Nursery
) -> None:
    model = await resolved(TIED, hub_config)
    cramped = attrs.evolve(hub_config, disk_margin=2**62)  # "keep 4 EiB free"
    service = await nursery.start(downloads_for(cramped, tmp_path).run)
    with trio.fail_after(TIMEOUT_S), pytest.raises(NoDiskSpace, match=r"needs .* more .* free"):
        await service.fetch(model)
    assert not [f for f in hub.downloads(TIED) if f.endswith(".safetensors")]


async def test_the_hugging_face_cache_is_shared_with_huggingface_hub(
    hub: FakeHub, downloads: Downloads, hub_config: HubConfig
) -> None:
    from huggingface_hub import snapshot_download, try_to_load_from_cache

    model = await resolved(UNTIED, hub_config)
    await downloads.fetch(model, ShardSpec(0, 2, 0, 2))
    commit = hub.repos[UNTIED].commit
    found = try_to_load_from_cache(
        UNTIED, BLOCKS_0, cache_dir=hub_config.cache_dir, revision=commit
    )
    assert isinstance(found, str) and Path(found).read_bytes()
    # What huggingface_hub (or mlx-lm) fetched, trexo does not fetch again.
    await trio.to_thread.run_sync(
        lambda: snapshot_download(
            UNTIED, cache_dir=hub_config.cache_dir, endpoint=hub.url, revision=commit
        )
    )
    asked = len(hub.requests)
    with trio.fail_after(TIMEOUT_S):
        snapshot = await downloads.fetch(model)
    assert len(weight_names(snapshot)) == 4
    assert hub.requests[asked:] == [], "\n".join(map(str, hub.requests[asked:]))
