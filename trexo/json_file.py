"""A model's JSON files (`config.json`, the weight index), read bounded and through the hardened
decoder.

They come from a hub, where anyone can upload a repository: a weight index nested 100,000
deep crashed the node (the standard library's parser recurses per level) each time it read
it, and so after every restart; a 300 MB config was read whole into memory. Here a file larger
than `max_bytes` is refused before it is read, and the rest goes through `trexo.safe_json`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trexo import safe_json
from trexo.config import MAX_HUB_JSON_BYTES


class BadJsonFile(ValueError):
    """The file is no JSON object trexo reads: too large, not JSON, nested too deep, or not
    an object. The message names the file and why."""


def read_json_object(path: Path, *, max_bytes: int = MAX_HUB_JSON_BYTES) -> dict[str, Any]:
    """The JSON object in the file at `path`. `BadJsonFile` if it is none (or larger than
    `max_bytes`); `OSError` (`FileNotFoundError`) if it cannot be read."""
    with path.open("rb") as file:
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise BadJsonFile(f"{path.name} is larger than {max_bytes} bytes")
    try:
        value = safe_json.loads(data)
    except safe_json.InvalidJson as exc:
        raise BadJsonFile(f"{path.name} is {exc}") from None
    if not isinstance(value, dict):
        raise BadJsonFile(f"{path.name} is not a JSON object")
    return value
