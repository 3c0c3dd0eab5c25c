"""The download process: `python -m trexo.hub.worker JOB_JSON`, one `FetchJob` per process.

It lists the repository (or, offline, the cache), fetches the small files, picks the weight
files the job's shard needs by the weight index, refuses up front if they cannot fit the
disk, then fetches them one by one, writing `FetchEvent`s to stdout as JSON lines. A node
stops a download no one needs any more by ending this process; what it fetched stays, and
the next process resumes. Its environment carries `HF_TOKEN` and `HF_ENDPOINT`, read by
huggingface_hub at import, and never written anywhere.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trexo import wire
from trexo.errors import HubError, NoDiskSpace, NotAModel, NotOnDisk
from trexo.hub.cache import RepoCache
from trexo.hub.fetch import fetch_file
from trexo.hub.files import (
    CONFIG_FILE,
    RepoFile,
    files_for_shard,
    is_small_file,
    is_weight_file,
)
from trexo.hub.listing import list_cached, list_remote
from trexo.hub.local import missing_for, read_index
from trexo.types.fetch import (
    FetchDone,
    FetchEvent,
    FetchFailed,
    FetchJob,
    FetchPlanned,
    FetchProgress,
)
from trexo.types.shard import ShardSpec
from trexo.units import format_bytes

EXIT_PARENT_GONE = 3


def _emit(event: FetchEvent) -> None:
    sys.stdout.buffer.write(wire.to_json(event, FetchEvent) + b"\n")
    sys.stdout.buffer.flush()


class _Progress:
    """Counts bytes and tells the node, at most every `interval` seconds."""

    def __init__(self, done: int, interval: float) -> None:
        self.done = done
        self._interval = interval
        self._told_at = 0.0
        self._told = done

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._told_at >= self._interval:
            self.tell(now)

    def tell(self, now: float | None = None) -> None:
        if self.done != self._told:
            self._told_at = time.monotonic() if now is None else now
            self._told = self.done
            _emit(FetchProgress(self.done))


def run(job: FetchJob) -> FetchDone:
    cache = RepoCache(Path(job.cache_dir), job.repo_id)
    shard = job.shard or ShardSpec()
    if job.offline:
        return _check_offline(job, cache, shard)
    listing = list_remote(
        job.repo_id, job.revision, endpoint=job.endpoint, timeout=job.request_timeout
    )
    commit = listing.commit
    if listing.file(CONFIG_FILE) is None:
        raise NotAModel(f"{job.repo_id} has no {CONFIG_FILE}: it is not an mlx-lm model")
    if not any(is_weight_file(f.name) for f in listing.files):
        raise NotAModel(f"{job.repo_id} has no .safetensors weights for mlx-lm")
    for file in listing.files:
        if is_small_file(file.name):  # the index among them, which the choice below reads
            _fetch(job, cache, commit, file, lambda _: None)
    try:
        wanted = files_for_shard(listing.files, read_index(cache, commit), shard)
    except ValueError as exc:
        raise NotAModel(f"{job.repo_id}: {exc}") from exc
    done = sum(_on_disk(cache, commit, f) for f in wanted)
    total = sum(f.size for f in wanted)
    _emit(FetchPlanned(commit, tuple(f.name for f in wanted), total, done))
    _check_space(cache, total - done, job.disk_margin)
    progress = _Progress(done, job.progress_interval)
    for file in wanted:
        _fetch(job, cache, commit, file, progress.add)
        progress.tell()
    cache.record_ref(job.revision, commit)
    return FetchDone(commit, str(cache.snapshot(commit)))


def _fetch(
    job: FetchJob, cache: RepoCache, commit: str, file: RepoFile, on_bytes: Callable[[int], None]
) -> None:
    fetch_file(
        cache, commit, file, endpoint=job.endpoint, on_bytes=on_bytes, chunk_bytes=job.chunk_bytes
    )


def _check_offline(job: FetchJob, cache: RepoCache, shard: ShardSpec) -> FetchDone:
    """Offline: whether the cache holds what `shard` needs; `NotOnDisk` naming what not."""
    listing = list_cached(cache, job.revision)
    commit = listing.commit
    missing = missing_for(cache, commit, shard)
    if missing:
        raise NotOnDisk(
            f"offline, and {job.repo_id} lacks {len(missing)} file(s) this node needs in its "
            f"Hugging Face cache ({cache.root}): {', '.join(missing)}"
        )
    size = sum(f.size for f in listing.files)
    _emit(FetchPlanned(commit, tuple(f.name for f in listing.files), size, size))
    return FetchDone(commit, str(cache.snapshot(commit)))


def _on_disk(cache: RepoCache, commit: str, file: RepoFile) -> int:
    if cache.has(commit, file.name, file.size):
        return file.size
    return min(file.size, cache.partial_bytes(file.etag)) if file.etag else 0


def _check_space(cache: RepoCache, needed: int, margin: int) -> None:
    where = cache.root
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if needed + margin > free:
        raise NoDiskSpace(
            f"{cache.repo_id} needs {format_bytes(needed)} more on this node, but "
            f"{where} has {format_bytes(free)} free"
        )


def _exit_when_parent_goes() -> None:
    """Read stdin until EOF: the node that started us closed it, or died."""
    while sys.stdin.buffer.read(4096):
        pass
    os._exit(EXIT_PARENT_GONE)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m trexo.hub.worker JOB_JSON", file=sys.stderr)
        return 2
    job: FetchJob = wire.from_json(argv[1], FetchJob)
    threading.Thread(target=_exit_when_parent_goes, name="parent-watch", daemon=True).start()
    try:
        _emit(run(job))
    except HubError as exc:
        _emit(FetchFailed(type(exc).__name__, str(exc)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
