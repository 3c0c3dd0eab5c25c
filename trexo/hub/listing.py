"""A repository's files at one commit: from the hub (its model-info endpoint, with the files'
sizes and hashes), or, offline, from what the cache holds. huggingface_hub's errors become
trexo's (`map_hub_errors`): the permanent ones (no such repository, gated, a hub that answers
what no hub would) are not retried, `HubUnreachable` may be.

Everything in a listing is the hub's word, and a hub (or a repository on it) can be hostile:
the listing is read bounded (`get_small`), parsed by the hardened decoder, and each name in it
that becomes a path (commit, hashes, file names) checked for its shape. One bad entry refuses
the whole listing: a hub that sends one would send others.

Blocking: call from a worker thread or the download process.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import Any
from urllib.parse import quote

import attrs

from trexo import safe_json
from trexo.config import HUB_SMALL_ANSWER_TIMEOUT_S, MAX_HUB_JSON_BYTES
from trexo.errors import (
    HubError,
    HubUnreachable,
    NoDiskSpace,
    NotAModel,
    NotOnDisk,
    RepoAccessDenied,
    RepoNotFound,
    UnsafeHubData,
)
from trexo.hub.cache import RepoCache
from trexo.hub.files import CONFIG_FILE, RepoFile, is_weight_file
from trexo.hub.names import (
    check_blob_id,
    check_commit,
    check_repo_id,
    check_revision,
    check_sha256,
    file_name_problem,
)
from trexo.hub.names import is_repo_id as is_repo_id
from trexo.hub.small_answer import get_small

DEFAULT_REVISION = "main"
TOKEN_HINT = "set HF_TOKEN to a token that has access (and accept the model's terms on the hub)"
_TRANSPORT_ERRORS = ("TransportError", "TimeoutException", "ConnectionError")
"""Class names, in any exception's MRO, of a request that never got an answer (httpx, httpx2
and the standard library)."""
_PERMANENT_HTTP_ERRORS = ("TooManyRedirects", "UnsupportedProtocol", "InvalidURL", "DecodingError")
"""Class names of answers no retry mends: a redirect loop (or a redirect to a scheme HTTP
cannot follow), a URL that cannot be one, a body that does not decode. Checked before the
transport errors (`UnsupportedProtocol` is one)."""


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
        if _is_a(exc, _PERMANENT_HTTP_ERRORS):
            raise UnsafeHubData(_permanent_problem(exc, repo_id, endpoint)) from exc
        if _is_transport_error(exc):
            raise HubUnreachable(f"cannot reach {endpoint}: {exc}") from exc
        if isinstance(exc, ValueError):  # huggingface_hub refusing what the listing said
            raise UnsafeHubData(f"{repo_id} on {endpoint}: {exc}") from exc
        raise


def _is_a(exc: BaseException, names: tuple[str, ...]) -> bool:
    return any(cls.__name__ in names for cls in type(exc).__mro__)


def _is_transport_error(exc: BaseException) -> bool:
    return _is_a(exc, _TRANSPORT_ERRORS)


def _permanent_problem(exc: BaseException, repo_id: str, endpoint: str) -> str:
    if _is_a(exc, ("TooManyRedirects",)):
        return f"{endpoint} redirects requests for {repo_id} in a loop (or too many times)"
    return f"{endpoint} answered {repo_id} with what no client can use: {exc}"


def list_remote(
    repo_id: str,
    revision: str,
    *,
    endpoint: str,
    timeout: float,
    max_bytes: int = MAX_HUB_JSON_BYTES,
    deadline: float = HUB_SMALL_ANSWER_TIMEOUT_S,
) -> RepoListing:
    """The repository's files at `revision` (resolved to its commit), from the hub; what
    huggingface_hub's `model_info(files_metadata=True)` asks for."""
    check_repo_id(repo_id)
    url = f"{endpoint}/api/models/{repo_id}/revision/{quote(check_revision(revision), safe='')}"
    what = f"the hub's listing of {repo_id}"
    with map_hub_errors(repo_id, endpoint):
        body = get_small(
            url,
            params={"blobs": True},
            timeout=timeout,
            deadline=deadline,
            max_bytes=max_bytes,
            what=what,
        )
    try:
        info = safe_json.loads(body)
    except safe_json.InvalidJson as exc:
        raise UnsafeHubData(f"{what} is refused: {exc}") from None
    return parse_listing(repo_id, info)


def parse_listing(repo_id: str, info: Any) -> RepoListing:
    """The listing in the hub's parsed answer; `UnsafeHubData` for the whole of it if any
    part is malformed or names an unsafe path."""
    refused = f"the hub's listing of {repo_id} is refused:"
    if not isinstance(info, dict):
        raise UnsafeHubData(f"{refused} it is not a JSON object")
    try:
        commit = check_commit(info.get("sha"), "its commit")
        siblings = info.get("siblings") or []
        if not isinstance(siblings, list):
            raise UnsafeHubData("its `siblings` is not a list")
        files = tuple(f for f in map(_listed_file, siblings) if f is not None)
    except UnsafeHubData as exc:
        raise UnsafeHubData(f"{refused} {exc}") from None
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        raise UnsafeHubData(f"{refused} it names a file twice")
    return RepoListing(repo_id, commit, files, _unix_time(info))


def _listed_file(sibling: Any) -> RepoFile | None:
    """One entry of `siblings`; None for one without a size (not what this client asked)."""
    if not isinstance(sibling, dict):
        raise UnsafeHubData("a file entry is not a JSON object")
    name = sibling.get("rfilename")
    if (problem := file_name_problem(name)) is not None or not isinstance(name, str):
        raise UnsafeHubData(f"file name {safe_json.excerpt(name)} {problem}")
    what = f"file {name!r}"
    lfs = sibling.get("lfs")
    if lfs is not None and not isinstance(lfs, dict):
        raise UnsafeHubData(f"{what} has an `lfs` that is not a JSON object")
    size = (lfs or sibling).get("size")
    if size is None:
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise UnsafeHubData(f"{what} has size {safe_json.excerpt(size)}, not a byte count")
    if lfs is not None:
        return RepoFile(name, size, sha256=check_sha256(lfs.get("sha256"), f"{what}'s sha256"))
    blob_id = sibling.get("blobId")
    return RepoFile(
        name, size, blob_id=None if blob_id is None else check_blob_id(blob_id, f"{what}'s blob id")
    )


def _unix_time(info: dict[str, Any]) -> int:
    """The repository's last change (else its creation) as Unix time; 0 if not stated."""
    for key in ("lastModified", "createdAt"):
        value = info.get(key)
        if isinstance(value, str):
            with suppress(ValueError):
                return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp())
    return 0


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
