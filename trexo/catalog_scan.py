"""The models this node's disk holds, scanned in a worker thread and remembered by what changed.

Listing models (`/v1/models`, `/api/tags`, every placement and preview) asked the Hugging Face
cache each time, on the event loop: a look at every cached repository's snapshots, its
`config.json` and its weight index. A large config held the loop 7.5 s per listing, and one
hostile config made every listing fail. Here a node-lifetime service scans in its own worker
thread (its own `trio.CapacityLimiter`, so no other kind of blocking work waits behind a scan
or a scan behind it) and keeps the result. It looks again every `interval` seconds and at
once when a download moves on, not per listing (every chat request looks its model up
here); a repository is read again only when the modification times of its folders differ
from the last scan (the cache renames every file into place, so each change touches one).
A listing reads only what the last scan found.

A repository whose files are no model (a hostile or broken `config.json` or index) is left
out, with one log line per change of its folders; the others are listed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from contextlib import suppress
from pathlib import Path

import attrs
import trio

from trexo.catalog import local_model_ref
from trexo.config import CATALOG_RESCAN_INTERVAL_S, CATALOG_SCAN_THREADS, MAX_HUB_JSON_BYTES
from trexo.engine.demo_model import DEMO_MODEL_NAMES, demo_model_name
from trexo.errors import HubError, ModelNotFound
from trexo.hub.cache import RepoCache, cached_repos
from trexo.hub.curated import curated_models
from trexo.hub.local import has_everything
from trexo.hub.resolve import cached_model
from trexo.types.models import ModelRef

log = logging.getLogger(__name__)

Fingerprint = tuple[tuple[str, int], ...]
"""(path, modification time in ns) of a repository's folders; -1: absent."""


@attrs.frozen
class RepoScan:
    """What one cached repository held when its folders had `fingerprint`."""

    fingerprint: Fingerprint
    model: ModelRef | None
    """The model it holds (its `main`, else its newest snapshot); None if none is usable."""
    problem: str | None = None
    """Why `model` is None."""
    complete: frozenset[str] = frozenset()
    """Commits whose snapshot holds every file of the whole model."""
    refs: tuple[tuple[str, str], ...] = ()
    """Branch -> commit, as the cache recorded them."""


def repo_fingerprint(cache: RepoCache) -> Fingerprint:
    """The modification times of the folders a change to `cache` touches."""
    folder = cache.folder
    paths = [folder, folder / "refs", folder / "blobs", folder / "snapshots"]
    with suppress(OSError):
        paths += sorted((folder / "snapshots").iterdir())
    return tuple((p.name, _mtime_ns(p)) for p in paths)


def _mtime_ns(path: Path) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


def scan_repo(cache: RepoCache, fingerprint: Fingerprint, max_json_bytes: int) -> RepoScan:
    """Read what `cache` holds (blocking); a repository that holds no model gets its reason."""
    refs = _refs(cache)
    complete = frozenset(c for c in _snapshot_commits(cache) if has_everything(cache, c))
    try:
        model = cached_model(cache, max_json_bytes=max_json_bytes)
    except HubError as exc:
        return RepoScan(fingerprint, None, str(exc), complete, refs)
    except Exception as exc:  # a bug, not the files: one repository's, logged, not the node's
        log.exception("scanning %s in the Hugging Face cache failed", cache.repo_id)
        return RepoScan(fingerprint, None, f"scanning failed: {exc!r}", complete, refs)
    return RepoScan(fingerprint, model, None, complete, refs)


def _snapshot_commits(cache: RepoCache) -> list[str]:
    try:
        names = [p.name for p in (cache.folder / "snapshots").iterdir()]
    except OSError:
        return []
    commits = []
    for name in names:
        try:
            if cache.snapshot(name).is_dir():
                commits.append(name)
        except HubError:
            continue  # not a commit: nothing trexo wrote, nor huggingface_hub
    return commits


def _refs(cache: RepoCache) -> tuple[tuple[str, str], ...]:
    try:
        names = sorted(p.name for p in (cache.folder / "refs").iterdir() if p.is_file())
    except OSError:
        return ()
    found = []
    for name in names:
        try:
            commit = cache.commit_of(name)
        except HubError:
            continue
        if commit is not None:
            found.append((name, commit))
    return tuple(found)


@attrs.frozen
class LocalScan:
    """What one model directory held when its folder had `mtime_ns`."""

    mtime_ns: int
    model: ModelRef | None


def scan_models_dir(models_dir: Path, previous: dict[str, LocalScan]) -> dict[str, LocalScan]:
    """The model directories in `models_dir` (blocking): each visible folder that is not a
    demo model and holds a `config.json`; one read again only when its folder changed."""
    demo_names = {demo_model_name(size) for size in DEMO_MODEL_NAMES}
    try:
        folders = [p for p in models_dir.iterdir() if p.is_dir()]
    except OSError:
        return {}
    found = {}
    for folder in sorted(folders):
        if folder.name.startswith(".") or folder.name in demo_names:
            continue  # a model being built, or a built-in
        mtime = _mtime_ns(folder)
        scan = previous.get(folder.name)
        if scan is None or scan.mtime_ns != mtime:
            try:
                scan = LocalScan(mtime, local_model_ref(folder))
            except ModelNotFound:
                scan = LocalScan(mtime, None)  # no config.json: not a model
        found[folder.name] = scan
    return found


class CatalogScan:
    """Start with `await nursery.start(scan.run)`: it returns once the first scan is done."""

    def __init__(
        self,
        cache_root: Path,
        models_dir: Path,
        local_models: Iterable[ModelRef] = (),
        *,
        interval: float = CATALOG_RESCAN_INTERVAL_S,
        max_json_bytes: int = MAX_HUB_JSON_BYTES,
        downloads_changed: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`downloads_changed()` returns when this node's downloads move on (one finished:
        its model is on disk now)."""
        self._cache_root = cache_root
        self._models_dir = models_dir
        self._interval = interval
        self._max_json_bytes = max_json_bytes
        self._limiter = trio.CapacityLimiter(CATALOG_SCAN_THREADS)
        self._curated = curated_models()
        self._repos: dict[str, RepoScan] = {}
        self._local_paths: dict[str, bool] = {m.source: False for m in local_models}
        """Local model directories (by `source`) -> whether their `config.json` is there."""
        self._built: frozenset[str] = frozenset()
        """Demo models built in `models_dir` (by size)."""
        self._in_models_dir: dict[str, LocalScan] = {}
        """Other model directories in `models_dir` (zoo models, copies), by name."""
        self._downloads_changed = downloads_changed
        self._wanted = trio.Event()
        self.scans = 0
        """Completed scans (for tests: a listing can wait for the next one)."""

    # --- what listings read (no I/O) --------------------------------------------------------

    def hub_models(self) -> list[ModelRef]:
        """Hub models the cache held at the last scan, then the curated ones it did not."""
        found = {s.model.model_id: s.model for s in self._repos.values() if s.model is not None}
        for entry in self._curated:
            found.setdefault(entry.model_id, entry.model_ref())
        return list(found.values())

    def models_dir_models(self) -> list[ModelRef]:
        """The model directories in `models_dir` at the last scan, demo models aside (as
        `trexo demo-model --arch NAME` builds them, or a user copies them there)."""
        return [s.model for s in self._in_models_dir.values() if s.model is not None]

    def unusable(self) -> dict[str, str]:
        """Cached repositories that hold no usable model, and why."""
        return {r: s.problem for r, s in self._repos.items() if s.problem is not None}

    def on_disk(self, model: ModelRef) -> bool:
        """Whether this node held every file of `model` at the last scan."""
        if (size := model.demo_size) is not None:
            return size in self._built
        revision = model.hub_revision
        if revision is None:
            if any(s.model == model for s in self._in_models_dir.values()):
                return True
            if model.source not in self._local_paths:
                self._local_paths[model.source] = False  # looked at from the next scan on
                self._wanted.set()
            return self._local_paths[model.source]
        scan = self._repos.get(revision.repo_id)
        if scan is None:
            return False
        commit = dict(scan.refs).get(revision.commit, revision.commit)
        return commit in scan.complete

    # --- scanning ---------------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[CatalogScan] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await self.rescan()
        async with trio.open_nursery() as nursery:
            if self._downloads_changed is not None:
                nursery.start_soon(self._follow_downloads, self._downloads_changed)
            task_status.started(self)
            while True:
                with trio.move_on_after(self._interval):
                    await self._wanted.wait()
                await self.rescan()

    async def _follow_downloads(self, changed: Callable[[], Awaitable[None]]) -> None:
        while True:
            await changed()
            self._wanted.set()

    async def rescan(self) -> None:
        """Scan now, in this service's worker thread."""
        self._wanted = trio.Event()
        repos, local, built = await trio.to_thread.run_sync(
            self._scan, dict(self._repos), list(self._local_paths), limiter=self._limiter
        )
        in_models_dir = await trio.to_thread.run_sync(
            scan_models_dir, self._models_dir, dict(self._in_models_dir), limiter=self._limiter
        )
        self._repos = repos
        self._local_paths.update(local)
        self._built = built
        self._in_models_dir = in_models_dir
        self.scans += 1

    def _scan(
        self, previous: dict[str, RepoScan], local_paths: list[str]
    ) -> tuple[dict[str, RepoScan], dict[str, bool], frozenset[str]]:
        repos = {}
        for cache in cached_repos(self._cache_root):
            fingerprint = repo_fingerprint(cache)
            scan = previous.get(cache.repo_id)
            if scan is None or scan.fingerprint != fingerprint:
                scan = scan_repo(cache, fingerprint, self._max_json_bytes)
                if scan.problem is not None:
                    log.warning(
                        "%s in %s is left out: %s", cache.repo_id, self._cache_root, scan.problem
                    )
            repos[cache.repo_id] = scan
        local = {source: (Path(source) / "config.json").is_file() for source in local_paths}
        built = frozenset(
            size
            for size in DEMO_MODEL_NAMES
            if (self._models_dir / demo_model_name(size) / "config.json").is_file()
        )
        return repos, local, built
