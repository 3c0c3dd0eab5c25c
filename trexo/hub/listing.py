"""A repository's files at one commit: from the hub (huggingface_hub's `model_info`), or, offline,
from what the cache holds. huggingface_hub's errors become trexo's (`map_hub_errors`).

Blocking: call from a worker thread or the download process.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import attrs

from trexo.errors import (
    HubError,
    HubUnreachable,
    NoDiskSpace,
    NotAModel,
    NotOnDisk,
    RepoAccessDenied,
    RepoNotFound,
)
from trexo.hub.cache import RepoCache
from trexo.hub.files import CONFIG_FILE, RepoFile, is_weight_file

DEFAULT_REVISION = "main"
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
"""`org/name` as the hub allows it (no `--` or `..`: checked apart)."""
TOKEN_HINT = "set HF_TOKEN to a token that has access (and accept the model's terms on the hub)"
_TRANSPORT_ERRORS = ("TransportError", "TimeoutException", "ConnectionError")
"""Class names, in any exception's MRO, of a request that never got an answer (httpx, httpx2
and the standard library)."""


def is_repo_id(text: str) -> bool:
    """Whether `text` has the shape of a hub repository id (`org/name`)."""
    return bool(REPO_ID.match(text)) and "--" not in text and ".." not in text


@attrs.frozen
class RepoListing:
    """What a repository holds at `commit`."""

    repo_id: str
    commit: str
    files: tuple[RepoFile, ...]
    created: int = 0
    """Unix time of the repository's last change (0: not known)."""

    def file(self, name: str) -> RepoFile | None:
        return next((f for f in self.files if f.name == name), None)

    @property
    def weight_bytes(self) -> int:
        return sum(f.size for f in self.files if is_weight_file(f.name))


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


@contextmanager
def map_hub_errors(repo_id: str, endpoint: str) -> Iterator[None]:
    """Turn huggingface_hub's exceptions (and network and disk errors) into `HubError`s."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except HubError:
        raise
    except GatedRepoError as exc:
        raise RepoAccessDenied(f"{repo_id} is a gated model: {TOKEN_HINT}") from exc
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        raise RepoNotFound(
            f"model {repo_id} does not exist on {endpoint} (if it is private, {TOKEN_HINT})"
        ) from exc
    except RemoteEntryNotFoundError as exc:
        raise NotAModel(f"{repo_id} lacks a file it lists: {exc}") from exc
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as exc:
        raise NotOnDisk(f"offline, and {repo_id} is not on this node's disk: {exc}") from exc
    except HfHubHTTPError as exc:
        status = _status(exc)
        if status in (401, 403):
            raise RepoAccessDenied(
                f"{endpoint} refused access to {repo_id} (HTTP {status}): {TOKEN_HINT}"
            ) from exc
        raise HubUnreachable(
            f"{endpoint} answered HTTP {status} for {repo_id}; retrying later"
        ) from exc
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise NoDiskSpace(f"the disk is full while fetching {repo_id}: {exc}") from exc
        if _is_transport_error(exc):
            raise HubUnreachable(f"cannot reach {endpoint}: {exc}") from exc
        raise
    except Exception as exc:
        if _is_transport_error(exc):
            raise HubUnreachable(f"cannot reach {endpoint}: {exc}") from exc
        raise


def _is_transport_error(exc: BaseException) -> bool:
    return any(cls.__name__ in _TRANSPORT_ERRORS for cls in type(exc).__mro__)


def list_remote(repo_id: str, revision: str, *, endpoint: str, timeout: float) -> RepoListing:
    """The repository's files at `revision` (resolved to its commit), from the hub."""
    from huggingface_hub import HfApi

    with map_hub_errors(repo_id, endpoint):
        info = HfApi(endpoint=endpoint).model_info(
            repo_id, revision=revision, files_metadata=True, timeout=timeout
        )
    return _listing(repo_id, info)


def _listing(repo_id: str, info: Any) -> RepoListing:
    commit = info.sha
    if not isinstance(commit, str) or not commit:
        raise NotAModel(f"the hub gave no commit for {repo_id}")
    files = []
    for sibling in info.siblings or ():
        lfs = sibling.lfs
        size = lfs.size if lfs is not None else sibling.size
        if not isinstance(size, int):
            continue  # a listing without sizes: not one this client asked for
        files.append(
            RepoFile(
                sibling.rfilename,
                size,
                sha256=lfs.sha256 if lfs is not None else None,
                blob_id=None if lfs is not None else sibling.blob_id,
            )
        )
    modified = info.last_modified or info.created_at
    created = int(modified.timestamp()) if modified is not None else 0
    return RepoListing(repo_id, commit, tuple(files), created)


def list_cached(cache: RepoCache, revision: str) -> RepoListing:
    """What the cache holds of the repository at `revision`; `NotOnDisk` if nothing."""
    commit = cache.commit_of(revision)
    if commit is None or not cache.snapshot(commit).is_dir():
        raise NotOnDisk(
            f"offline, and {cache.repo_id} (revision {revision}) is not in this node's "
            f"Hugging Face cache ({cache.root})"
        )
    present = cache.snapshot_files(commit)
    files = tuple(RepoFile(name, size) for name, size in sorted(present.items()))
    created = 0
    with suppress(OSError):
        created = int(cache.pointer(commit, CONFIG_FILE).stat().st_mtime)
    return RepoListing(cache.repo_id, commit, files, created)
