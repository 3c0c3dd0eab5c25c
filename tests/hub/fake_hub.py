"""A Hugging Face hub on 127.0.0.1 for tests and benchmarks: the endpoints huggingface_hub uses.

- `GET /api/models/<org>/<name>[/revision/<rev>]`: the model's info, with `siblings` (size,
  git blob id, and for large files `lfs.sha256`), as `model_info(files_metadata=True)` reads it;
- `GET /api/models/<org>/<name>/tree/<rev>`: the file list `snapshot_download` reads;
- `HEAD` / `GET /<org>/<name>/resolve/<rev>/<file>`: the file, with the headers the client
  checks (`ETag`, `X-Repo-Commit`, `Content-Length`) and HTTP Range (206);
- errors as the hub sends them: an unknown repository is 401 with `X-Error-Code: RepoNotFound`,
  a gated one 401 with `X-Error-Code: GatedRepo` unless the request has the token.

Knobs for tests: `rate` (bytes per second of the hub's link, shared by every response),
`unavailable` (answer 503), and a log of every request. Threads, not trio: the nodes under
test are other processes.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs

LFS_SUFFIXES = (".safetensors",)
SEND_CHUNK = 64 * 1024
RANGE = re.compile(r"^bytes=(\d+)-$")
CREATED = "2026-01-01T00:00:00.000Z"


@attrs.frozen
class HubFile:
    name: str
    path: Path
    size: int
    sha256: str | None
    blob_id: str

    @property
    def etag(self) -> str:
        return self.sha256 or self.blob_id

    def tree_entry(self) -> dict[str, Any]:
        """As `list_repo_tree` (used by `snapshot_download`) reads it."""
        entry: dict[str, Any] = {
            "type": "file",
            "path": self.name,
            "size": self.size,
            "oid": self.blob_id,
        }
        if self.sha256 is not None:
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": 134}
        return entry

    def sibling(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"rfilename": self.name, "size": self.size, "blobId": self.blob_id}
        if self.sha256 is not None:
            entry["lfs"] = {"sha256": self.sha256, "size": self.size, "pointerSize": 134}
        return entry


@attrs.frozen
class HubRepo:
    repo_id: str
    commit: str
    files: dict[str, HubFile]
    gated: bool = False


def hub_file(name: str, path: Path) -> HubFile:
    data = path.read_bytes()
    blob_id = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
    sha256 = hashlib.sha256(data).hexdigest() if name.endswith(LFS_SUFFIXES) else None
    return HubFile(name, path, len(data), sha256, blob_id)


def hub_repo(repo_id: str, directory: Path, *, gated: bool = False) -> HubRepo:
    files = {p.name: hub_file(p.name, p) for p in sorted(directory.iterdir()) if p.is_file()}
    commit = hashlib.sha1(
        "".join(f"{f.name}:{f.etag}" for f in files.values()).encode()
    ).hexdigest()
    return HubRepo(repo_id, commit, files, gated)


@attrs.define
class FakeHub:
    repos: dict[str, HubRepo] = attrs.field(factory=dict)
    rate: float | None = None
    """Bytes per second of the hub's link, shared by all responses (None: no limit)."""
    unavailable: bool = False
    """Answer every request with 503 (a hub that is down)."""
    token: str = "hf_test_token"
    """The token that opens gated repositories."""
    requests: list[tuple[str, str, str]] = attrs.field(factory=list)
    """(method, path, Range header or "") of every request, in order."""
    url: str = ""

    _link_lock: threading.Lock = attrs.field(factory=threading.Lock)
    _link_free_at: float = 0.0

    def wait_for_link(self, size: int) -> None:
        """Sleep until `size` more bytes fit the link's `rate`, shared by every response (as
        one network link is)."""
        rate = self.rate
        if not rate:
            return
        with self._link_lock:
            now = time.monotonic()
            start = max(now, self._link_free_at)
            self._link_free_at = start + size / rate
        if start > now:
            time.sleep(start - now)

    def add(self, repo_id: str, directory: Path, *, gated: bool = False) -> HubRepo:
        repo = hub_repo(repo_id, directory, gated=gated)
        self.repos[repo_id] = repo
        return repo

    def downloads(self, repo_id: str) -> list[str]:
        """Files of `repo_id` fetched with GET, in order."""
        prefix = f"/{repo_id}/resolve/"
        return [
            path.split("/")[-1]
            for method, path, _ in self.requests
            if method == "GET" and path.startswith(prefix)
        ]

    def ranges(self, repo_id: str, name: str) -> list[str]:
        """The Range header of every GET of one file ("" when it asked for all of it)."""
        path = f"/{repo_id}/resolve/"
        return [
            wanted
            for method, got, wanted in self.requests
            if method == "GET" and got.startswith(path) and got.endswith(f"/{name}")
        ]


class HubHandler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        hub = self.server.hub
        path = self.path.split("?", 1)[0]
        hub.requests.append((self.command, path, self.headers.get("Range", "")))
        if hub.unavailable:
            self._error(503, None, "the hub is down")
            return
        if path.startswith("/api/models/"):
            self._info(path.removeprefix("/api/models/"))
            return
        match = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if match is None:
            self._error(404, None, "no such endpoint")
            return
        self._file(*match.groups(), body=body)

    def _repo(self, repo_id: str, revision: str) -> HubRepo | None:
        repo = self.server.hub.repos.get(repo_id)
        if repo is None:
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        if revision not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", "Invalid rev id")
            return None
        return repo

    def _tree(self, repo_id: str, revision: str) -> None:
        repo = self._repo(repo_id, revision)
        if repo is not None:
            entries = [f.tree_entry() for f in repo.files.values()]
            self._send(200, json.dumps(entries).encode(), {"Content-Type": "application/json"})

    def _info(self, rest: str) -> None:
        if (tree := re.match(r"^([^/]+/[^/]+)/tree/([^/]+)$", rest)) is not None:
            self._tree(*tree.groups())
            return
        repo_id, _, revision = rest.partition("/revision/")
        repo = self._repo(repo_id, revision or "main")
        if repo is None:
            return
        info = {
            "id": repo.repo_id,
            "sha": repo.commit,
            "private": False,
            "gated": "manual" if repo.gated else False,
            "createdAt": CREATED,
            "lastModified": CREATED,
            "siblings": [f.sibling() for f in repo.files.values()],
        }
        self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"})

    def _file(self, repo_id: str, revision: str, name: str, *, body: bool) -> None:
        repo = self._repo(repo_id, revision)
        if repo is None:
            return
        hub = self.server.hub
        if repo.gated and self.headers.get("Authorization") != f"Bearer {hub.token}":
            self._error(401, "GatedRepo", "Access to model is restricted")
            return
        file = repo.files.get(name)
        if file is None:
            self._error(404, "EntryNotFound", "Entry not found")
            return
        start = 0
        if (wanted := RANGE.match(self.headers.get("Range", ""))) is not None:
            start = min(int(wanted.group(1)), file.size)
        headers = {
            "ETag": f'"{file.etag}"',
            "X-Repo-Commit": repo.commit,
            "Accept-Ranges": "bytes",
            "Content-Length": str(file.size - start),
        }
        status = 200
        if start:
            status = 206
            headers["Content-Range"] = f"bytes {start}-{file.size - 1}/{file.size}"
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self._stream(file.path, start)

    def _stream(self, path: Path, start: int) -> None:
        hub = self.server.hub
        with path.open("rb") as f:
            f.seek(start)
            while chunk := f.read(SEND_CHUNK):
                hub.wait_for_link(len(chunk))
                try:
                    self.wfile.write(chunk)
                except OSError:  # the client went away
                    return

    def _error(self, status: int, code: str | None, message: str) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Message": message}
        if code is not None:
            headers["X-Error-Code"] = code
        self._send(status, json.dumps({"error": message}).encode(), headers)

    def _send(self, status: int, data: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub: FakeHub, handler: type[HubHandler] = HubHandler) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.hub = hub

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that left: usual
            super().handle_error(request, client_address)


@contextmanager
def serving(
    hub: FakeHub | None = None, handler: type[HubHandler] = HubHandler
) -> Iterator[FakeHub]:
    """`hub` served on a free port of 127.0.0.1 (its `url` set) until the block ends;
    `handler` answers its requests (a subclass of `HubHandler` can misbehave)."""
    hub = hub or FakeHub()
    server = _Server(hub, handler)
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="fake-hub", daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
