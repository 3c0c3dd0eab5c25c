"""The download process: `python -m trexo.hub.worker`, `FetchJob`s in, `FetchEvent`s out.

Jobs arrive one at a time as JSON lines on stdin. For each it lists the repository (or,
offline, the cache), picks the files the job's shard needs (for a pipeline rank, by the
weight index), refuses up front if they cannot fit the disk, then fetches them (a few at a
time), writing `FetchEvent`s to stdout as JSON lines, the last one `FetchDone` or
`FetchFailed`. The process stays for the next job, so a node pays for its start (the
interpreter and huggingface_hub: ~0.5 s here) once. A node stops a download no one needs
any more by ending the process; what it fetched stays, and the next job resumes it. EOF on
stdin (the node closed it, or died) ends the process at once. Its environment carries
`HF_TOKEN` and `HF_ENDPOINT`, read by huggingface_hub at import, and never written anywhere.
"""

from __future__ import annotations

import os
import queue
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trexo import wire
from trexo.errors import (
    DownloadCrashed,
    HubError,
    NoDiskSpace,
    NotAModel,
    NotOnDisk,
    UnsafeHubData,
)
from trexo.hub.cache import RepoCache
from trexo.hub.fetch import fetch_file, link_file
from trexo.hub.files import (
    CONFIG_FILE,
    TOKENIZER_CONFIG,
    WEIGHT_INDEX,
    RepoFile,
    files_for_shard,
    is_weight_file,
)
from trexo.hub.listing import list_cached, list_remote
from trexo.hub.local import missing_for, read_index
from trexo.safe_json import bounded
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
"""How the process ends: at EOF on stdin, skipping interpreter teardown (threads may still
be reading from the network or stdin)."""


PARALLEL_FILES = 4
"""Weight files fetched at once (huggingface_hub's `snapshot_download` uses 8 threads)."""
_emit_lock = threading.Lock()


def _emit(event: FetchEvent) -> None:
    with _emit_lock:
        sys.stdout.buffer.write(wire.to_json(event, FetchEvent) + b"\n")
        sys.stdout.buffer.flush()


class _Progress:
    """Counts bytes from any thread and tells the node, at most every `interval` seconds."""

    def __init__(self, done: int, interval: float) -> None:
        self.done = done
        self._interval = interval
        self._told_at = 0.0
        self._told = done
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            due = time.monotonic() - self._told_at >= self._interval
        if due:
            self.tell()

    def tell(self) -> None:
        with self._lock:
            if self.done == self._told:
                return
            self._told_at = time.monotonic()
            self._told = done = self.done
        _emit(FetchProgress(done))


def run(job: FetchJob) -> FetchDone:
    cache = RepoCache(Path(job.cache_dir), job.repo_id)
    shard = job.shard or ShardSpec()
    if job.offline:
        return _check_offline(job, cache, shard)
    listing = list_remote(
        job.repo_id,
        job.revision,
        endpoint=job.endpoint,
        timeout=job.request_timeout,
        max_bytes=job.max_json_bytes,
    )
    commit = listing.commit
    if listing.file(CONFIG_FILE) is None:
        raise NotAModel(f"{job.repo_id} has no {CONFIG_FILE}: it is not an mlx-lm model")
    if not any(is_weight_file(f.name) for f in listing.files):
        raise NotAModel(f"{job.repo_id} has no .safetensors weights for mlx-lm")
    needs_index = not (shard.is_whole or shard.sharding == "tensor")
    index_file = listing.file(WEIGHT_INDEX)
    if needs_index and index_file is not None:  # it says which weight files this shard needs
        if index_file.size > job.max_json_bytes:
            raise UnsafeHubData(
                f"{job.repo_id}'s {WEIGHT_INDEX} is larger than {job.max_json_bytes} bytes "
                f"({index_file.size} listed): not fetched"
            )
        _fetch(job, cache, commit, index_file, lambda _: None)
        link_file(cache, commit, index_file)
    try:
        index = read_index(cache, commit, job.max_json_bytes) if needs_index else None
        wanted = files_for_shard(listing.files, index, shard)
    except ValueError as exc:
        raise NotAModel(f"{job.repo_id}: {exc}") from exc
    done = sum(_on_disk(cache, commit, f) for f in wanted)
    total = sum(f.size for f in wanted)
    _emit(FetchPlanned(commit, tuple(f.name for f in wanted), total, done))
    _check_space(cache, total - done, job.disk_margin)
    progress = _Progress(done, job.progress_interval)
    with ThreadPoolExecutor(PARALLEL_FILES, thread_name_prefix="fetch") as pool:
        for fetched in [pool.submit(_fetch, job, cache, commit, f, progress.add) for f in wanted]:
            fetched.result()  # the first failure is raised; `with` waits for the others
            progress.tell()
    # Into the snapshot only now, all together and the tokenizer's config last: a reader
    # that finds it (the API's prompt counter) finds the whole tokenizer, not part of it.
    for file in sorted(wanted, key=lambda f: f.name == TOKENIZER_CONFIG):
        link_file(cache, commit, file)
    cache.record_ref(job.revision, commit)
    return FetchDone(commit, str(cache.snapshot(commit)))


def _fetch(
    job: FetchJob, cache: RepoCache, commit: str, file: RepoFile, on_bytes: Callable[[int], None]
) -> None:
    fetch_file(
        cache,
        commit,
        file,
        endpoint=job.endpoint,
        on_bytes=on_bytes,
        chunk_bytes=job.chunk_bytes,
        link=False,
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


def _read_jobs(jobs: queue.SimpleQueue[bytes]) -> None:
    """Stdin's lines to `jobs`; at EOF (the node closed it, or died) end the process."""
    for line in sys.stdin.buffer:
        jobs.put(line)
    os._exit(EXIT_PARENT_GONE)


def main() -> None:
    jobs: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    threading.Thread(target=_read_jobs, args=(jobs,), name="jobs", daemon=True).start()
    while True:
        job: FetchJob = wire.from_json(jobs.get(), FetchJob)
        try:
            _emit(run(job))
        except HubError as exc:
            _emit(FetchFailed(type(exc).__name__, str(exc)))
        except Exception as exc:  # a bug: its traceback to the log, its reason to the node
            traceback.print_exc()
            reason = bounded(repr(exc))
            _emit(FetchFailed(DownloadCrashed.__name__, f"the download failed: {reason}"))


if __name__ == "__main__":
    main()
