"""Fetch one file of a repository into the Hugging Face cache: resumable, checked, atomic.

huggingface_hub does the transfer (`http_get`: headers, token, redirects, HTTP Range, its own
retries of a dropped connection); trexo keeps the partial file under a stable name so that a
killed download resumes, checks the size and the hash against the hub's listing, and only
then renames the file into place and links it into the snapshot. Blocking: it runs in the
download process (`trexo.hub.worker`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

from trexo.errors import CorruptDownload
from trexo.hub.cache import RepoCache
from trexo.hub.files import RepoFile
from trexo.hub.listing import map_hub_errors

HASH_BLOCK_BYTES = 4 * 1024 * 1024
BytesCallback = Callable[[int], None]


def fetch_file(
    cache: RepoCache,
    commit: str,
    file: RepoFile,
    *,
    endpoint: str,
    on_bytes: BytesCallback,
    chunk_bytes: int,
) -> None:
    """Make the snapshot of `commit` hold `file`, downloading what is missing of it.

    `on_bytes(n)` is called as n more bytes arrive. Raises a `HubError` (`CorruptDownload`
    after a mismatch, having removed the bad bytes so that the next attempt starts clean).
    """
    etag = file.etag
    if etag is None:
        raise CorruptDownload(f"the hub listed {file.name} of {cache.repo_id} without a hash")
    if cache.has(commit, file.name, file.size):
        return
    blob = cache.blob(etag)
    cache.lock(etag).parent.mkdir(parents=True, exist_ok=True)
    with FileLock(cache.lock(etag)):
        if not _complete(blob, file.size):
            _download(cache, commit, file, etag, endpoint, on_bytes, chunk_bytes)
        cache.link(commit, file.name, etag)


def _complete(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False


def _download(
    cache: RepoCache,
    commit: str,
    file: RepoFile,
    etag: str,
    endpoint: str,
    on_bytes: BytesCallback,
    chunk_bytes: int,
) -> None:
    from huggingface_hub import constants
    from huggingface_hub.file_download import hf_hub_url, http_get
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

    partial = cache.partial(etag)
    partial.parent.mkdir(parents=True, exist_ok=True)
    resume = cache.partial_bytes(etag)
    if resume > file.size:  # not this content: start over
        partial.unlink()
        resume = 0
    url = hf_hub_url(cache.repo_id, file.name, revision=commit, endpoint=endpoint)
    # Progress, and what a kill loses, come in chunks of this size (huggingface_hub reads
    # this module constant on every call; its default is 10 MiB).
    constants.DOWNLOAD_CHUNK_SIZE = chunk_bytes
    if resume < file.size:
        with map_hub_errors(cache.repo_id, endpoint), partial.open("ab") as out:
            http_get(
                url,
                out,
                resume_size=resume,
                headers=build_hf_headers(),
                expected_size=file.size,
                displayed_filename=file.name,
                tqdm_class=_progress_class(on_bytes),
            )
            out.flush()
            os.fsync(out.fileno())
    problem = verify(partial, file)
    if problem is not None:
        partial.unlink(missing_ok=True)
        raise CorruptDownload(f"{cache.repo_id}/{file.name}: {problem}; fetching it again")
    partial.replace(cache.blob(etag))
    _fsync_dir(partial.parent)


def verify(path: Path, file: RepoFile) -> str | None:
    """What is wrong with `path` as the content of `file` (None: nothing). Large files are
    checked by their sha256, small ones by their git blob id, both as the hub lists them."""
    size = path.stat().st_size
    if size != file.size:
        return f"{size} bytes, but the hub lists {file.size}"
    if file.sha256 is not None:
        digest = _digest(path, hashlib.sha256())
        if digest != file.sha256:
            return f"sha256 {digest}, but the hub lists {file.sha256}"
    elif file.blob_id is not None:
        git = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)
        digest = _digest(path, git)
        if digest != file.blob_id:
            return f"git blob id {digest}, but the hub lists {file.blob_id}"
    return None


def _digest(path: Path, hasher: Any) -> str:
    with path.open("rb") as f:
        while block := f.read(HASH_BLOCK_BYTES):
            hasher.update(block)
    return str(hasher.hexdigest())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _progress_class(on_bytes: BytesCallback) -> type:
    """A tqdm class for huggingface_hub that shows nothing and reports each chunk."""
    from tqdm import tqdm

    class Progress(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if n:
                on_bytes(int(n))
            return None

    return Progress
