"""What this node's Hugging Face cache already holds of a model. Blocking (small reads)."""

from __future__ import annotations

from typing import Any

from trexo.config import MAX_HUB_JSON_BYTES
from trexo.errors import NotAModel
from trexo.hub.cache import RepoCache
from trexo.hub.files import CONFIG_FILE, WEIGHT_INDEX, missing_weight_files
from trexo.json_file import BadJsonFile, read_json_object
from trexo.types.shard import ShardSpec


def read_index(
    cache: RepoCache, commit: str, max_bytes: int = MAX_HUB_JSON_BYTES
) -> dict[str, Any] | None:
    """The snapshot's parsed weight index; None if it has none; `NotAModel` if it is no JSON
    object (or larger than `max_bytes`: a hub's file, read bounded and by the hardened
    decoder, since one nested 100,000 deep crashed the node on every read)."""
    try:
        return read_json_object(cache.pointer(commit, WEIGHT_INDEX), max_bytes=max_bytes)
    except FileNotFoundError:
        return None
    except BadJsonFile as exc:
        raise NotAModel(f"{cache.repo_id}: {exc}") from None


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
