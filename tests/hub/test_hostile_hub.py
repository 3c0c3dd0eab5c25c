"""A hostile hub (or a hostile repository on an honest one) against the hub client, in process.

Whatever it sends, the client answers with a clear `HubError` for that model, never a crash
(`RecursionError`, `ValueError: embedded null byte`, an httpx error), never writes outside
its cache, and never takes more than a listing announced.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from trexo.api.errors import find_api_error
from trexo.catalog_scan import repo_fingerprint, scan_repo
from trexo.config import HubConfig
from trexo.errors import (
    CorruptDownload,
    DownloadCrashed,
    HubError,
    HubUnreachable,
    NotAModel,
    UnsafeHubData,
)
from trexo.hub.cache import RepoCache
from trexo.hub.downloads import Downloads, gives_up
from trexo.hub.fetch import fetch_file
from trexo.hub.files import CONFIG_FILE, WEIGHT_INDEX, RepoFile
from trexo.hub.local import has_everything
from trexo.hub.resolve import resolve_model
from trexo.hub.worker import run as run_job
from trexo.types.fetch import FetchJob
from trexo.types.models import HubRevision, ModelRef
from trexo.types.shard import ShardSpec

from .conftest import TEST_SETTINGS, downloads_for
from .fake_hub import serving
from .hostile_hub import (
    ENDLESS,
    WEIGHTS,
    HostileHandler,
    HostileHub,
    deep_json,
    honest_info,
    tiny_repo,
)

REPO = "hostile/tiny"
DEEP = 20_000
"""Far past Python's recursion limit (1000) and the decoder's depth bound; within the
tests' size bound (256 KiB)."""


@pytest.fixture
def hostile() -> Iterator[HostileHub]:
    with serving(HostileHub(), HostileHandler) as hub:
        assert isinstance(hub, HostileHub)
        yield hub


@pytest.fixture
def config(tmp_path: Path, hostile: HostileHub) -> HubConfig:
    return HubConfig(
        cache_dir=tmp_path / "hf-cache",
        endpoint=hostile.url,
        offline=False,
        max_json_bytes=256 * 1024,
        **TEST_SETTINGS,
    )


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """A directory outside the cache that a hostile hub aims at; it must stay as it is."""
    path = tmp_path / "target"
    path.mkdir()
    (path / "keep.txt").write_text("mine")
    return path


def api_status(error: BaseException) -> int:
    """The HTTP status an API client gets for `error` (a placement, a preview)."""
    found = find_api_error(error)
    assert found is not None, f"{error!r} would be a 500"
    return found.status


def untouched(target: Path) -> bool:
    return sorted(p.name for p in target.iterdir()) == ["keep.txt"]


def add_repo(hub: HostileHub, tmp_path: Path, repo_id: str = REPO, config: Any = None) -> Any:
    return hub.add(repo_id, tiny_repo(tmp_path / "repo" / repo_id.replace("/", "_"), config))


def hostile_listing(
    hub: HostileHub, tmp_path: Path, *, sha: Any = None, file: dict[str, Any] | None = None
) -> None:
    """`REPO`'s honest listing with its commit, or one sibling's fields, replaced."""
    repo = add_repo(hub, tmp_path)
    info = honest_info(repo)
    if sha is not None:
        info["sha"] = sha
    if file is not None:
        info["siblings"].append(file)
    hub.listing(REPO, info)


# --- the listing's names become paths: each is checked, the listing refused whole ------------


@pytest.mark.parametrize(
    "sha",
    [
        "{target}",  # absolute: once replaced a file in the target with a symlink
        "../../../target",
        "abc\0def" + "0" * 33,
        "0" * 39 + "g",
        "A" * 40,
        "0" * 41,
    ],
)
def test_a_listing_whose_commit_is_not_a_commit_hash_is_refused(
    hostile: HostileHub, config: HubConfig, tmp_path: Path, target: Path, sha: str
) -> None:
    hostile_listing(hostile, tmp_path, sha=sha.format(target=target))
    with pytest.raises(NotAModel, match="commit"):
        resolve_model(REPO, config)
    assert untouched(target)


BLOB = "0" * 40
SHA = "0" * 64


@pytest.mark.parametrize(
    "file",
    [
        {"rfilename": "../escape.json", "size": 3, "blobId": BLOB},
        {"rfilename": "/abs/escape.json", "size": 3, "blobId": BLOB},
        {"rfilename": "sub/../../escape.json", "size": 3, "blobId": BLOB},
        {"rfilename": "a\0b.json", "size": 3, "blobId": BLOB},
        {"rfilename": "..\\escape.json", "size": 3, "blobId": BLOB},
        {"rfilename": "C:escape.json", "size": 3, "blobId": BLOB},
        {"rfilename": "", "size": 3, "blobId": BLOB},
        {"rfilename": ".", "size": 3, "blobId": BLOB},
        {"rfilename": "ok.json", "size": 3, "blobId": "../../../target/x"},
        {"rfilename": "ok.json", "size": 3, "blobId": "{target}/x"},
        {
            "rfilename": "w.safetensors",
            "size": 3,
            "blobId": BLOB,
            "lfs": {"sha256": "../x", "size": 3, "pointerSize": 134},
        },
        {
            "rfilename": "w.safetensors",
            "size": 3,
            "blobId": BLOB,
            "lfs": {"sha256": SHA[:-1] + "\0", "size": 3, "pointerSize": 134},
        },
        {
            "rfilename": "w.safetensors",
            "size": -3,
            "blobId": BLOB,
            "lfs": {"sha256": SHA, "size": -3, "pointerSize": 134},
        },
        {"rfilename": 7, "size": 3, "blobId": BLOB},
    ],
)
def test_a_listing_with_one_unsafe_file_is_refused_whole(
    hostile: HostileHub, config: HubConfig, tmp_path: Path, target: Path, file: dict[str, Any]
) -> None:
    file = {k: v.format(target=target) if isinstance(v, str) else v for k, v in file.items()}
    hostile_listing(hostile, tmp_path, file=file)
    with pytest.raises(NotAModel, match="refused") as refused:
        resolve_model(REPO, config)
    assert untouched(target)
    assert api_status(refused.value) == 400
    # Refused whole: not even the honest config.json was fetched.
    assert not (config.cache_dir / "models--hostile--tiny" / "snapshots").exists()


@pytest.mark.parametrize(
    "body",
    [deep_json(DEEP), b"[" * DEEP + b"]" * DEEP, b"[1, 2]", b'"a string"', b"\xff\xfe", b"{"],
    ids=["deep-objects", "deep-arrays", "array", "string", "not-utf8", "truncated"],
)
def test_a_listing_that_is_no_json_object_is_a_clear_error(
    hostile: HostileHub, config: HubConfig, tmp_path: Path, body: bytes
) -> None:
    add_repo(hostile, tmp_path)
    hostile.listing(REPO, body)
    with pytest.raises(NotAModel, match="listing"):
        resolve_model(REPO, config)


def test_a_listing_larger_than_the_bound_is_refused(
    hostile: HostileHub, config: HubConfig, tmp_path: Path
) -> None:
    repo = add_repo(hostile, tmp_path)
    info = honest_info(repo)
    info["padding"] = "x" * (config.max_json_bytes + 1)
    hostile.listing(REPO, info)
    with pytest.raises(NotAModel, match="larger than"):
        resolve_model(REPO, config)


def test_a_redirect_loop_is_a_clear_error_at_once(
    hostile: HostileHub, config: HubConfig, tmp_path: Path
) -> None:
    add_repo(hostile, tmp_path)
    hostile.redirect_loops.add(REPO)
    with pytest.raises(NotAModel, match="redirect") as refused:
        resolve_model(REPO, config)
    assert api_status(refused.value) == 400


# --- the repository's own files: config.json and the weight index -------------------------


@pytest.mark.parametrize(
    "config_body",
    [deep_json(DEEP), b"[" * DEEP + b"]" * DEEP, b"[1]", b"\xff", b"null"],
    ids=["deep-objects", "deep-arrays", "array", "not-utf8", "null"],
)
def test_a_config_json_that_is_no_json_object_is_not_a_model(
    hostile: HostileHub, config: HubConfig, tmp_path: Path, config_body: bytes
) -> None:
    add_repo(hostile, tmp_path, config=config_body)
    with pytest.raises(NotAModel, match=CONFIG_FILE) as refused:
        resolve_model(REPO, config)
    assert api_status(refused.value) == 400


def test_a_config_json_larger_than_the_bound_is_not_fetched(
    hostile: HostileHub, config: HubConfig, tmp_path: Path
) -> None:
    add_repo(hostile, tmp_path, config=b" " * (config.max_json_bytes + 1) + b"{}")
    with pytest.raises(NotAModel, match="larger than"):
        resolve_model(REPO, config)
    assert not hostile.downloads(REPO)


def deep_index_repo(hub: HostileHub, tmp_path: Path) -> Any:
    directory = tiny_repo(tmp_path / "repo" / "deep-index")
    (directory / WEIGHT_INDEX).write_bytes(deep_json(DEEP))
    return hub.add(REPO, directory)


def test_a_nested_weight_index_in_the_cache_is_not_a_model_not_a_crash(
    hostile: HostileHub, config: HubConfig, tmp_path: Path
) -> None:
    """It crashed the node, and again after each restart (the cache keeps it)."""
    repo = deep_index_repo(hostile, tmp_path)
    resolve_model(REPO, config)  # the index is fetched; it is read when needed
    cache = RepoCache(config.cache_dir, REPO)
    assert cache.has(repo.commit, WEIGHT_INDEX)
    assert not has_everything(cache, repo.commit)
    # The catalog (every `/v1/models`, `/api/tags`, placement) reads it as not on disk;
    # offline, the cache alone answers, with a clear error.
    scan = scan_repo(cache, repo_fingerprint(cache), config.max_json_bytes)
    assert not scan.complete
    with pytest.raises(HubError):
        resolve_model(REPO, HubConfig(cache_dir=config.cache_dir, offline=True))


# --- transfers: never more than the listing announced ---------------------------------------


def listed(repo: Any, name: str) -> RepoFile:
    file = repo.files[name]
    return RepoFile(file.name, file.size, sha256=file.sha256, blob_id=file.blob_id)


def fetch(config: HubConfig, repo: Any, name: str) -> None:
    fetch_file(
        RepoCache(config.cache_dir, REPO),
        repo.commit,
        listed(repo, name),
        endpoint=config.endpoint,
        on_bytes=lambda _: None,
        chunk_bytes=config.chunk_bytes,
    )


def blob_bytes(config: HubConfig) -> list[int]:
    blobs = config.cache_dir / "models--hostile--tiny" / "blobs"
    return [p.stat().st_size for p in blobs.iterdir()] if blobs.is_dir() else []


@pytest.mark.parametrize("too_long", ["fifty times the listed size", "endless"])
def test_a_body_longer_than_listed_stops_at_the_listed_size(
    hostile: HostileHub, config: HubConfig, tmp_path: Path, too_long: str
) -> None:
    repo = add_repo(hostile, tmp_path)
    size = repo.files[WEIGHTS].size
    hostile.bodies[f"{REPO}/{WEIGHTS}"] = ENDLESS if too_long == "endless" else bytes(size * 50)
    with pytest.raises(CorruptDownload, match="longer than"):
        fetch(config, repo, WEIGHTS)
    assert all(n <= size for n in blob_bytes(config))


def test_a_config_longer_than_listed_is_a_retryable_error_when_resolving(
    hostile: HostileHub, config: HubConfig, tmp_path: Path
) -> None:
    repo = add_repo(hostile, tmp_path)
    size = repo.files[CONFIG_FILE].size
    hostile.bodies[f"{REPO}/{CONFIG_FILE}"] = ENDLESS
    with pytest.raises(HubUnreachable, match="longer than") as failed:
        resolve_model(REPO, config)
    assert api_status(failed.value) == 503
    assert all(n <= size for n in blob_bytes(config))


def test_a_body_shorter_than_listed_is_a_corrupt_download(
    hostile: HostileHub, config: HubConfig, tmp_path: Path
) -> None:
    repo = add_repo(hostile, tmp_path)
    hostile.bodies[f"{REPO}/{WEIGHTS}"] = b"short"
    with pytest.raises(CorruptDownload):
        fetch(config, repo, WEIGHTS)


def test_a_file_redirected_in_a_loop_is_a_clear_error(
    hostile: HostileHub, config: HubConfig, tmp_path: Path
) -> None:
    repo = add_repo(hostile, tmp_path)
    hostile.redirect_loops.add(REPO)
    with pytest.raises(NotAModel, match="redirect"):
        fetch(config, repo, WEIGHTS)


# --- model references that peers or clients send ---------------------------------------------


@pytest.mark.parametrize(
    "commit", ["abc\0def", "../../../target", "{target}", "0" * 39 + "\0", "main\0"]
)
async def test_a_model_reference_with_an_unsafe_commit_is_a_clear_error(
    nursery: trio.Nursery, config: HubConfig, tmp_path: Path, target: Path, commit: str
) -> None:
    commit = commit.format(target=target)
    model = ModelRef(REPO, HubRevision(REPO, commit).source, 1)
    downloads: Downloads = await nursery.start(downloads_for(config, tmp_path).run)
    with pytest.raises(NotAModel, match="commit"):
        await downloads.fetch(model)
    assert untouched(target)


# --- the download process's job, run in this process ------------------------------------------


def job(config: HubConfig, revision: str = "main", shard: ShardSpec | None = None) -> FetchJob:
    return FetchJob(
        repo_id=REPO,
        revision=revision,
        shard=shard,
        cache_dir=str(config.cache_dir),
        endpoint=config.endpoint,
        offline=False,
        chunk_bytes=config.chunk_bytes,
        progress_interval=config.progress_interval,
        disk_margin=0,
        request_timeout=config.request_timeout,
        max_json_bytes=config.max_json_bytes,
    )


PIPELINE_RANK = ShardSpec(start_layer=0, end_layer=1, rank=0, world_size=2)


def test_a_download_of_a_hostile_listing_fails_for_good_with_its_reason(
    hostile: HostileHub, config: HubConfig, tmp_path: Path, target: Path
) -> None:
    hostile_listing(hostile, tmp_path, file={"rfilename": "a\0b.json", "size": 3, "blobId": BLOB})
    with pytest.raises(HubError, match="refused") as failed:
        run_job(job(config))
    assert not failed.value.retryable
    assert untouched(target)


def test_a_download_redirected_in_a_loop_fails_for_good(
    hostile: HostileHub, config: HubConfig, tmp_path: Path
) -> None:
    """It crashed the download process, and the node retried it forever."""
    add_repo(hostile, tmp_path)
    hostile.redirect_loops.add(REPO)
    with pytest.raises(HubError, match="redirect") as failed:
        run_job(job(config))
    assert not failed.value.retryable


def test_a_download_needing_a_nested_index_fails_for_good(
    hostile: HostileHub, config: HubConfig, tmp_path: Path
) -> None:
    deep_index_repo(hostile, tmp_path)
    with pytest.raises(HubError, match=WEIGHT_INDEX) as failed:
        run_job(job(config, shard=PIPELINE_RANK))
    assert not failed.value.retryable


def test_an_oversized_weight_index_is_not_fetched_by_a_download(
    hostile: HostileHub, config: HubConfig, tmp_path: Path
) -> None:
    directory = tiny_repo(tmp_path / "repo" / "big-index")
    (directory / WEIGHT_INDEX).write_bytes(b" " * (config.max_json_bytes + 1) + b"{}")
    hostile.add(REPO, directory)
    with pytest.raises(HubError, match="larger than"):
        run_job(job(config, shard=PIPELINE_RANK))
    assert WEIGHT_INDEX not in hostile.downloads(REPO)


# --- which failures a download retries -------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "failures", "stops"),
    [
        (UnsafeHubData("a redirect loop"), 1, True),
        (NotAModel("no weights"), 1, True),
        (HubUnreachable("network down"), 100, False),  # for as long as someone waits
        (CorruptDownload("wrong hash"), 1, False),
        (CorruptDownload("wrong hash"), 4, True),  # the hub sends wrong bytes: give up
        (DownloadCrashed("killed"), 3, False),
        (DownloadCrashed("killed"), 4, True),
    ],
)
def test_permanent_failures_stop_a_download_and_repeated_corruption_too(
    error: HubError, failures: int, stops: bool
) -> None:
    assert gives_up(error, failures, limit=4) is stops
