"""A hub that attacks its client: the fake hub's server, with answers no honest hub sends.

- `infos`: the raw body of a repository's listing (`/api/models/<repo>[/revision/<rev>]`),
  whatever it holds: a commit (`sha`) that is a path, hashes and file names that climb out of
  the cache (`../`, absolute, NUL), JSON nested thousands deep;
- `bodies`: what a file's GET sends instead of the file: bytes longer than listed, or an
  endless stream (`ENDLESS`: no `Content-Length`, sent until the client hangs up);
- `redirect_loops`: repositories whose every request is redirected to itself;
- files are served for any revision asked, so a hostile commit reaches the file route.

`tiny_repo` writes a small repository (a llama `config.json` and a few bytes of "weights":
nothing here loads a model) and `honest_info` its listing, for a test to corrupt one field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from .fake_hub import CREATED, FakeHub, HubHandler, HubRepo

ENDLESS = b""
"""In `bodies`: send zeros until the client hangs up."""
ENDLESS_CAP_BYTES = 256 * 1024 * 1024
"""Where an endless body stops anyway: a client that never stops must fail its test, not fill
the test machine's disk."""
LLAMA_CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 64,
    "hidden_size": 32,
    "vocab_size": 100,
}
WEIGHTS = "model.safetensors"


def tiny_repo(directory: Path, config: Any = None) -> Path:
    """A repository that resolves: `config.json` (`config`, by default a small llama's, or
    raw bytes) and a weight file."""
    directory.mkdir(parents=True)
    raw = config if isinstance(config, bytes) else json.dumps(config or LLAMA_CONFIG).encode()
    (directory / "config.json").write_bytes(raw)
    (directory / WEIGHTS).write_bytes(bytes(range(256)) * 16)
    return directory


def deep_json(depth: int) -> bytes:
    """Valid JSON nested `depth` levels: Python's parser recurses once per level."""
    return b'{"a":' * depth + b"1" + b"}" * depth


def honest_info(repo: HubRepo) -> dict[str, Any]:
    """The listing the fake hub would send for `repo`."""
    return {
        "id": repo.repo_id,
        "sha": repo.commit,
        "private": False,
        "gated": False,
        "createdAt": CREATED,
        "lastModified": CREATED,
        "siblings": [f.sibling() for f in repo.files.values()],
    }


@attrs.define
class HostileHub(FakeHub):
    infos: dict[str, bytes] = attrs.field(factory=dict)
    """Repository id -> the raw body of its listing."""
    bodies: dict[str, bytes] = attrs.field(factory=dict)
    """`<repo id>/<file name>` -> what a GET of that file sends (`ENDLESS`: zeros, forever)."""
    redirect_loops: set[str] = attrs.field(factory=set)
    """Repository ids whose every request is redirected to the same URL."""
    sent: dict[str, int] = attrs.field(factory=dict)
    """`<repo id>/<file name>` -> bytes of a hostile body sent before the client hung up."""

    def listing(self, repo_id: str, info: Any) -> None:
        """Send `info` (JSON-encoded unless bytes) as the listing of `repo_id`."""
        self.infos[repo_id] = info if isinstance(info, bytes) else json.dumps(info).encode()


class HostileHandler(HubHandler):
    @property
    def hostile(self) -> HostileHub:
        hub = self.server.hub
        assert isinstance(hub, HostileHub)
        return hub

    def _answer(self, *, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        repo_id = "/".join(path.removeprefix("/api/models/").lstrip("/").split("/")[:2])
        if repo_id in self.hostile.redirect_loops:
            self.hostile.requests.append((self.command, path, ""))
            self.send_response(302)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if path.startswith("/api/models/") and "/tree/" not in path:
            repo_id = path.removeprefix("/api/models/").partition("/revision/")[0]
            if (raw := self.hostile.infos.get(repo_id)) is not None:
                self.hostile.requests.append((self.command, path, ""))
                self._send(200, raw, {"Content-Type": "application/json"})
                return
        super()._answer(body=body)

    def _repo(self, repo_id: str, revision: str) -> HubRepo | None:
        repo = self.server.hub.repos.get(repo_id)
        if repo is None:
            return super()._repo(repo_id, revision)
        return repo  # any revision: a hostile listing's commit reaches the files

    def _file(self, repo_id: str, revision: str, name: str, *, body: bool) -> None:
        key = f"{repo_id}/{name}"
        hostile = self.hostile.bodies.get(key)
        if hostile is None:
            super()._file(repo_id, revision, name, body=body)
            return
        repo = self.server.hub.repos[repo_id]
        file = repo.files[name]
        self.send_response(200)
        self.send_header("ETag", f'"{file.etag}"')
        self.send_header("X-Repo-Commit", repo.commit)
        if not hostile:  # ENDLESS
            self.send_header("Connection", "close")
            self.close_connection = True
        else:
            self.send_header("Content-Length", str(len(hostile)))
        self.end_headers()
        if body:
            self._send_hostile(key, hostile)

    def _send_hostile(self, key: str, data: bytes) -> None:
        chunk = data or bytes(64 * 1024)
        sent = 0
        try:
            while sent < ENDLESS_CAP_BYTES:
                self.wfile.write(chunk)
                sent += len(chunk)
                if data:
                    break
        except OSError:  # the client hung up: what the test wants of an endless body
            pass
        self.hostile.sent[key] = sent
