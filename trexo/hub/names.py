"""Names from a hub, or from a model reference, that become paths in the cache: each checked
against its strict shape before any use. Pure: no I/O.

A listing's commit, hashes and file names, and a reference's repository and revision, are
parts of paths in the Hugging Face cache (`snapshots/<commit>/<file>`, `blobs/<sha256>`,
`refs/<revision>`). Unchecked, a listing whose commit was `/target/dir` had the cache link a
file into /target/dir, and a commit with a NUL in it crashed the node. Every check raises
`UnsafeHubData` naming the value (quoted short, whatever its length); `RepoCache` also checks
that each path it builds stays inside its root.
"""

from __future__ import annotations

import re

from trexo.errors import UnsafeHubData
from trexo.safe_json import excerpt

COMMIT = re.compile(r"^[0-9a-f]{40}$")
"""A git commit id, as the hub writes it (lower-case hex)."""
SHA256 = re.compile(r"^[0-9a-f]{64}$")
"""A large (LFS) file's content hash: its name in `blobs/`."""
BLOB_ID = re.compile(r"^[0-9a-f]{40}$")
"""A small file's git blob id: its name in `blobs/`."""
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$", re.ASCII)
"""`org/name` as the hub allows it (no `--` or `..`: checked apart)."""
REVISION_PART = re.compile(r"^[A-Za-z0-9_][\w.-]{0,127}$", re.ASCII)
"""One part of a branch or tag name (`main`, `v1.0`, `refs/pr/1`): no leading dot, so no
`.`, `..` or hidden file."""
MAX_REVISION_CHARS = 256
MAX_FILE_NAME_BYTES = 1024
MAX_FILE_PART_BYTES = 255
"""A file name's part, in bytes: what Linux and macOS file systems allow."""
_UNSAFE_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")
"""Control characters (NUL ends a path in C), and the backslash (a separator on Windows:
`..\\x` climbs there)."""
_DRIVE = re.compile(r"^[A-Za-z]:")


def is_repo_id(text: str) -> bool:
    """Whether `text` has the shape of a hub repository id (`org/name`)."""
    return bool(REPO_ID.match(text)) and "--" not in text and ".." not in text


def check_repo_id(value: object) -> str:
    if not isinstance(value, str) or not is_repo_id(value):
        raise UnsafeHubData(f"{excerpt(value)} is not a Hugging Face repository id (org/name)")
    return value


def check_commit(value: object, what: str = "commit") -> str:
    if not isinstance(value, str) or not COMMIT.match(value):
        raise UnsafeHubData(f"{what} {excerpt(value)} is not a commit hash (40 hex digits)")
    return value


def check_sha256(value: object, what: str = "sha256") -> str:
    if not isinstance(value, str) or not SHA256.match(value):
        raise UnsafeHubData(f"{what} {excerpt(value)} is not a sha256 (64 hex digits)")
    return value


def check_blob_id(value: object, what: str = "git blob id") -> str:
    if not isinstance(value, str) or not BLOB_ID.match(value):
        raise UnsafeHubData(f"{what} {excerpt(value)} is not a git blob id (40 hex digits)")
    return value


def check_etag(value: object) -> str:
    """A blob's name in the cache: a sha256 or a git blob id."""
    if isinstance(value, str) and (SHA256.match(value) or BLOB_ID.match(value)):
        return value
    raise UnsafeHubData(f"blob name {excerpt(value)} is neither a sha256 nor a git blob id")


def check_revision(value: object) -> str:
    """A commit hash, or a branch or tag name whose parts are plain names."""
    if isinstance(value, str) and (COMMIT.match(value) or _is_revision_name(value)):
        return value
    raise UnsafeHubData(
        f"revision {excerpt(value)} is neither a commit hash (40 hex digits) nor a branch name"
    )


def _is_revision_name(text: str) -> bool:
    return len(text) <= MAX_REVISION_CHARS and all(
        REVISION_PART.match(part) for part in text.split("/")
    )


def file_name_problem(name: object) -> str | None:
    """Why `name` cannot be a file's path under a snapshot; None if it can: relative, its
    parts plain names (no `.` or `..`, no NUL or control character, no backslash, no drive)."""
    if not isinstance(name, str):
        return "is not a string"
    if not name:
        return "is empty"
    if _UNSAFE_CHARS.search(name):
        return "holds a control character or a backslash"
    try:
        encoded = name.encode()
    except UnicodeEncodeError:
        return "is not UTF-8 text"
    if len(encoded) > MAX_FILE_NAME_BYTES:
        return f"is longer than {MAX_FILE_NAME_BYTES} bytes"
    if name.startswith("/") or _DRIVE.match(name):
        return "is absolute"
    for part in name.split("/"):
        if part in ("", ".", ".."):
            return "has an empty, '.' or '..' part"
        if len(part.encode()) > MAX_FILE_PART_BYTES:
            return f"has a part longer than {MAX_FILE_PART_BYTES} bytes"
    return None


def check_file_name(value: object) -> str:
    problem = file_name_problem(value)
    if problem is not None:
        raise UnsafeHubData(f"file name {excerpt(value)} {problem}")
    assert isinstance(value, str)
    return value
