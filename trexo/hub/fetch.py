"""Fetch one file of a repository into the Hugging Face cache: resumable, checked, atomic.

huggingface_hub does the transfer (`http_get`: headers, token, redirects, HTTP Range, its own
retries of a dropped connection); trexo keeps the partial file under a stable name so that a
killed download resumes, checks the size and the hash against the hub's listing, and only
then renames the file into place and links it into the snapshot. Blocking: it runs in the
download process (`trexo.hub.worker`).

The listing's size is also the transfer's bound: a body longer than listed (an endless one)
stops there with `CorruptDownload`, its bytes removed, so a hostile hub cannot fill the disk.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from filelock import FileLock

from trexo.durable import fsync_dir
from trexo.errors import CorruptDownload, UnsafeHubData
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
    link: bool = True,
) -> None:
    """Make the blob of `file` complete and checked, downloading what is missing of it, and
    (with `link`) make the snapshot of `commit` hold it (`link_file` does that later).

    `on_bytes(n)` is called as n more bytes arrive. Raises a `HubError` (`CorruptDownload`
    after a mismatch, having removed the bad bytes so that the next attempt starts clean).
    """
    etag = file.etag
    if etag is None:
        raise UnsafeHubData(f"the hub listed {file.name} of {cache.repo_id} without a hash")
    if cache.has(commit, file.name, file.size):
        return
    blob = cache.blob(etag)
    cache.lock(etag).parent.mkdir(parents=True, exist_ok=True)
    with FileLock(cache.lock(etag)):
        if not _complete(blob, file.size):
            _download(cache, commit, file, etag, endpoint, on_bytes, chunk_bytes)
        if link:
            cache.link(commit, file.name, etag)


def link_file(cache: RepoCache, commit: str, file: RepoFile) -> None:
    """Make the snapshot of `commit` hold `file`, whose blob `fetch_file` completed."""
    if file.etag is not None and not cache.has(commit, file.name, file.size):
        cache.link(commit, file.name, file.etag)


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
    from huggingface_hub.file_download import hf_hub_url

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
    try:
        with partial.open("ab") as out:
            checked = ContentCheck(file, partial, resume)
            if resume < file.size:
                _transfer(cache, url, checked.writer(out), resume, file, endpoint, on_bytes)
                out.flush()
                os.fsync(out.fileno())
    except CorruptDownload as exc:  # a body longer than listed: what came cannot be trusted
        partial.unlink(missing_ok=True)
        raise CorruptDownload(f"{cache.repo_id}/{exc}") from None
    problem = checked.problem()
    if problem is not None:
        partial.unlink(missing_ok=True)
        raise CorruptDownload(f"{cache.repo_id}/{file.name}: {problem}; fetching it again")
    partial.replace(cache.blob(etag))
    fsync_dir(partial.parent)


def _transfer(
    cache: RepoCache,
    url: str,
    out: _HashingWriter,
    resume: int,
    file: RepoFile,
    endpoint: str,
    on_bytes: BytesCallback,
) -> None:
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

    try:
        with map_hub_errors(cache.repo_id, endpoint):
            http_get(
                url,
                out,  # type: ignore[arg-type]
                resume_size=resume,
                headers=build_hf_headers(),
                expected_size=file.size,
                displayed_filename=file.name,
                tqdm_class=_progress_class(on_bytes),
            )
    except OSError as exc:
        if exc.errno is not None:  # the disk's error, not the transfer's
            raise
        # huggingface_hub's consistency check: the body ended short of the listed size.
        # `ContentCheck.problem` says so, and the bad bytes go.


class ContentCheck:
    """The hash of a file's content as it is written, checked against the hub's listing:
    sha256 for large files, the git blob id for small ones.

    Hashing the bytes on their way to disk costs no second read of the file (~1 s per GB
    here). A resumed file's bytes already on disk are read once first.
    """

    def __init__(self, file: RepoFile, path: Path, already: int) -> None:
        self._file = file
        self._path = path
        self._hasher = self._new_hasher()
        self._written = 0
        if already:
            with path.open("rb") as f:
                while block := f.read(HASH_BLOCK_BYTES):
                    self._update(block)

    def _new_hasher(self) -> Any:
        if self._file.sha256 is not None:
            return hashlib.sha256()
        git = hashlib.sha1(usedforsecurity=False)
        git.update(f"blob {self._file.size}\0".encode())  # the git blob id's header
        return git

    def _update(self, data: bytes) -> None:
        self._hasher.update(data)
        self._written += len(data)

    def writer(self, out: BinaryIO) -> _HashingWriter:
        return _HashingWriter(out, self)

    def restart(self) -> None:
        """The file was cut back to nothing (a server that ignored our Range)."""
        self._hasher = self._new_hasher()
        self._written = 0

    def problem(self) -> str | None:
        """What is wrong with the content written (None: nothing)."""
        size = self._path.stat().st_size
        if size != self._file.size or self._written != size:
            return f"{size} bytes, but the hub lists {self._file.size}"
        expected = self._file.sha256 or self._file.blob_id
        if expected is None:
            return None
        digest = str(self._hasher.hexdigest())
        kind = "sha256" if self._file.sha256 is not None else "git blob id"
        return None if digest == expected else f"{kind} {digest}, but the hub lists {expected}"


class _HashingWriter:
    """The file object huggingface_hub writes to: each write goes to the hash too."""

    def __init__(self, out: BinaryIO, check: ContentCheck) -> None:
        self._out = out
        self._check = check

    def write(self, data: bytes) -> int:
        listed = self._check._file.size
        room = listed - self._check._written
        if len(data) > room:  # never more than listed: an endless body must not fill the disk
            self._check._update(data[:room])
            self._out.write(data[:room])
            raise CorruptDownload(
                f"{self._check._file.name}: the hub sent a body longer than the "
                f"{listed} bytes it lists; fetching it again"
            )
        self._check._update(data)
        return self._out.write(data)

    def tell(self) -> int:
        return self._out.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._out.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        cut = self._out.truncate(size)
        if cut == 0:
            self._check.restart()
        else:  # never done by huggingface_hub: a cut midway cannot be un-hashed
            raise CorruptDownload(f"{self._check._file.name}: cut to {cut} bytes midway")
        return cut


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
