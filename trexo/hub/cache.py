"""The Hugging Face cache's layout, which trexo shares with huggingface_hub and mlx-lm.

    <cache>/models--<org>--<name>/blobs/<etag>                 a file's content
    <cache>/models--<org>--<name>/blobs/<etag>.incomplete      a download in progress
    <cache>/models--<org>--<name>/snapshots/<commit>/<file>    -> ../../blobs/<etag>
    <cache>/models--<org>--<name>/refs/<branch>                the commit a branch was at
    <cache>/.locks/models--<org>--<name>/<etag>.lock           held while writing a blob

A model mlx-lm (or `huggingface-cli download`) fetched before is found here and not fetched
again, and what trexo fetches mlx-lm finds. Unlike huggingface_hub ≥ 1.31, which names each
attempt's partial file uniquely and so starts over after a crash, trexo keeps one
`<etag>.incomplete` per blob (the name huggingface_hub's cache scanner knows), so a download
killed midway resumes where it stopped; the lock is huggingface_hub's own, so the two never
write one blob at the same time.

Every name that goes into a path here (repository, commit, revision, blob, file name) is
checked against its strict shape (`trexo.hub.names`), and every path built is checked to
stay inside the cache: a hostile listing or model reference gets `UnsafeHubData`, never a
path elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from trexo.errors import UnsafeHubData
from trexo.hub.names import (
    COMMIT,
    check_commit,
    check_etag,
    check_file_name,
    check_repo_id,
    check_revision,
    is_repo_id,
)

REPO_FOLDER_PREFIX = "models--"
PARTIAL_SUFFIX = ".incomplete"


def repo_folder_name(repo_id: str) -> str:
    return REPO_FOLDER_PREFIX + repo_id.replace("/", "--")


def repo_id_of_folder(name: str) -> str | None:
    """The repository id a cache folder holds (`models--org--name` -> `org/name`)."""
    if not name.startswith(REPO_FOLDER_PREFIX):
        return None
    return name.removeprefix(REPO_FOLDER_PREFIX).replace("--", "/") or None


@attrs.frozen
class RepoCache:
    """One model repository's part of a Hugging Face cache."""

    root: Path
    repo_id: str = attrs.field()

    @repo_id.validator
    def _check_repo_id(self, _: object, value: str) -> None:
        check_repo_id(value)

    @property
    def folder(self) -> Path:
        return self.root / repo_folder_name(self.repo_id)

    def blob(self, etag: str) -> Path:
        return self._inside(self.folder / "blobs" / check_etag(etag))

    def partial(self, etag: str) -> Path:
        return self._inside(self.folder / "blobs" / f"{check_etag(etag)}{PARTIAL_SUFFIX}")

    def lock(self, etag: str) -> Path:
        name = f"{check_etag(etag)}.lock"
        return self._inside(self.root / ".locks" / repo_folder_name(self.repo_id) / name)

    def snapshot(self, commit: str) -> Path:
        return self._inside(self.folder / "snapshots" / check_commit(commit))

    def pointer(self, commit: str, name: str) -> Path:
        return self._inside(self.snapshot(commit) / check_file_name(name))

    def _ref(self, revision: str) -> Path:
        return self._inside(self.folder / "refs" / check_revision(revision))

    def _inside(self, path: Path) -> Path:
        """`path`, once its folder, with every link in it followed, is inside the cache (its
        last part may be a link: a snapshot's file points into `blobs/`)."""
        root = self.root.resolve()
        if not path.parent.resolve().is_relative_to(root):
            raise UnsafeHubData(f"{path} is outside the Hugging Face cache {root}")
        return path

    def commit_of(self, revision: str) -> str | None:
        """The commit `revision` names: itself if it is a commit hash, else what the cache
        recorded for that branch or tag (None if nothing)."""
        if COMMIT.match(check_revision(revision)):
            return revision
        try:
            recorded = self._ref(revision).read_text().strip()
        except OSError:
            return None
        return recorded if COMMIT.match(recorded) else None

    def record_ref(self, revision: str, commit: str) -> None:
        check_commit(commit)
        if revision == commit:
            return
        path = self._ref(revision)
        if path.is_file() and path.read_text().strip() == commit:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(commit)
        temporary.replace(path)

    def has(self, commit: str, name: str, size: int | None = None) -> bool:
        """Whether the snapshot holds `name` (its blob complete: of `size` bytes, if given)."""
        try:
            found = self.pointer(commit, name).stat().st_size  # follows the link to the blob
        except OSError:
            return False
        return size is None or found == size

    def link(self, commit: str, name: str, etag: str) -> None:
        """Make the snapshot's `name` point at blob `etag` (relative, as huggingface_hub
        does, so that the cache can be moved)."""
        pointer = self.pointer(commit, name)
        pointer.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(self.blob(etag), pointer.parent)
        temporary = pointer.with_name(f".{pointer.name}.{os.getpid()}.link")
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(target)
        temporary.replace(pointer)

    def snapshot_files(self, commit: str) -> dict[str, int]:
        """Files the snapshot holds whose blob is complete, with their sizes."""
        snapshot = self.snapshot(commit)
        found: dict[str, int] = {}
        try:
            entries = list(snapshot.iterdir())
        except OSError:
            return found
        for entry in entries:
            try:
                found[entry.name] = entry.stat().st_size
            except OSError:
                continue  # a link to a blob that is gone
        return found

    def partial_bytes(self, etag: str) -> int:
        try:
            return self.partial(etag).stat().st_size
        except OSError:
            return 0


def cached_repos(root: Path) -> list[RepoCache]:
    """Every model repository the cache at `root` has a folder for."""
    try:
        folders = sorted(root.iterdir())
    except OSError:
        return []
    found = []
    for folder in folders:
        repo_id = repo_id_of_folder(folder.name)
        if repo_id is not None and is_repo_id(repo_id) and folder.is_dir():
            found.append(RepoCache(root, repo_id))
    return found
