"""The dashboard's files as the API serves them: at `/` and `/dashboard/NAME`, locked to
their origin, with nothing fetched from anywhere else, and packaged with trexo."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from importlib.resources import files
from pathlib import Path

import httpx
import pytest
import trio

from trexo.api.dashboard import CONTENT_SECURITY_POLICY
from trexo.dashboard import INDEX, load_assets

TEST_TIMEOUT_S = 30.0
ROOT = Path(__file__).parents[2]
REMOTE_URL = re.compile(rb"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", re.IGNORECASE)


async def test_the_page_is_served_at_the_root(http: httpx.AsyncClient) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.content == load_assets()[INDEX].body
    assert b'src="/dashboard/app.js"' in response.content


@pytest.mark.parametrize(
    ("name", "content_type"),
    [("app.js", "text/javascript; charset=utf-8"), ("style.css", "text/css; charset=utf-8")],
)
async def test_its_files_are_served(http: httpx.AsyncClient, name: str, content_type: str) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.get(f"/dashboard/{name}")
    assert response.status_code == 200
    assert response.headers["content-type"] == content_type
    assert response.content == (files("trexo.dashboard") / name).read_bytes()


@pytest.mark.parametrize("path", ["/dashboard/nope.js", "/dashboard/__init__.py", "/index.html"])
async def test_other_names_are_the_apis_json_404(http: httpx.AsyncClient, path: str) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        response = await http.get(path)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "unknown_url"


def test_nothing_is_fetched_from_elsewhere() -> None:
    """No CDN, no web font, no remote script: the page works with no internet."""
    for asset in load_assets().values():
        assert REMOTE_URL.search(asset.body.replace(b"http://www.w3.org/2000/svg", b"")) is None, (
            asset.name
        )


def test_every_file_is_packaged() -> None:
    """pyproject's package-data puts every file the dashboard serves into the wheel."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["trexo.dashboard"]
    served = load_assets()
    assert set(served) >= {"index.html", "app.js", "style.css"}
    for name in served:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name
    on_disk = {p.name for p in (ROOT / "trexo" / "dashboard").iterdir() if p.suffix != ".py"}
    assert on_disk - {"__pycache__"} == set(served)
