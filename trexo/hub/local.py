"""What this node's Hugging Face cache already holds of a model. Blocking (small reads)."""

from __future__ import annotations

import json
from typing import Any

from trexo.errors import NotAModel
from trexo.hub.cache import RepoCache
from trexo.hub.files import CONFIG_FILE, WEIGHT_INDEX, missing_weight_files
from trexo.types.shard import ShardSpec


def read_index(cache: RepoCache, commit: str) -> dict[str, Any] | None:
    """The snapshot's parsed weight index; None if it has none; `NotAModel` if unreadable."""
    try:
        text = cache.pointer(commit, WEIGHT_INDEX).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        index = json.loads(text)
    except ValueError as exc:
        raise NotAModel(f"{cache.repo_id}: {WEIGHT_INDEX} is not JSON: {exc}") from exc
    if not isinstance(index, dict):
        raise NotAModel(f"{cache.repo_id}: {WEIGHT_INDEX} is not a JSON object")
    return index


def missing_for(cache: RepoCache, commit: str, shard: ShardSpec) -> list[str]:
    """Files the runner holding `shard` needs that the snapshot lacks (by the weight index)."""
    present = cache.snapshot_files(commit)
    missing = [] if CONFIG_FILE in present else [CONFIG_FILE]
    if missing:
        return missing  # no config: the download has not begun (nor has its index come)
    try:
        return missing_weight_files(read_index(cache, commit), shard, present)
    except ValueError as exc:
        raise NotAModel(f"{cache.repo_id}: {exc}") from exc


def has_everything(cache: RepoCache, commit: str, shard: ShardSpec = ShardSpec()) -> bool:
    """Whether the snapshot holds what `shard` (by default the whole model) needs."""
    try:
        return not missing_for(cache, commit, shard)
    except NotAModel:
        return False
