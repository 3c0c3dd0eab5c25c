"""The dashboard's files: a page that shows and drives the cluster (`trexo.api.dashboard`
serves it at `/`). Plain HTML, CSS and JavaScript packaged with trexo: no build step,
nothing fetched from the network, and everything it shows comes from the public API
(`/state/events`, `/v1/models`, `/instances`, `/v1/chat/completions`, `/v1/cancel`)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import PurePath

import attrs

INDEX = "index.html"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}


@attrs.frozen
class Asset:
    name: str
    body: bytes
    content_type: str


def load_assets() -> dict[str, Asset]:
    """Every file of the dashboard by name, read once (together a few tens of KB)."""
    assets = {}
    for entry in files(__name__).iterdir():
        content_type = CONTENT_TYPES.get(PurePath(entry.name).suffix)
        if content_type is not None and entry.is_file():
            assets[entry.name] = Asset(entry.name, entry.read_bytes(), content_type)
    return assets
