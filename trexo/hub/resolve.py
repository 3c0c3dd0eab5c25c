"""A Hugging Face repository id -> a `ModelRef` pinned to one commit. Blocking: run in a thread.

Online, the hub's listing gives the commit and the file sizes, and the repository's
`config.json` (fetched into the cache, where the runners will find it) gives the layout
placement needs. Offline (`HF_HUB_OFFLINE=1`), or when the hub cannot be reached but the cache
holds the model, the cache answers instead.

The config and the weight index are the repository's word: fetched only if the listing says
they are at most `HubConfig.max_json_bytes`, and read through the hardened decoder
(`trexo.json_file`); one that is no JSON object makes the repository `NotAModel`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from trexo.catalog import layout_of
from trexo.config import MAX_HUB_JSON_BYTES, HubConfig
from trexo.errors import CorruptDownload, HubUnreachable, NotAModel, NotOnDisk, UnsafeHubData
from trexo.hub.cache import RepoCache
from trexo.hub.fetch import fetch_file
from trexo.hub.files import CONFIG_FILE, WEIGHT_INDEX, is_weight_file
from trexo.hub.listing import DEFAULT_REVISION, RepoListing, list_cached, list_remote
from trexo.json_file import BadJsonFile, read_json_object
from trexo.types.models import HubRevision, ModelRef

log = logging.getLogger(__name__)


def resolve_model(repo_id: str, config: HubConfig, revision: str = DEFAULT_REVISION) -> ModelRef:
    """`repo_id` at `revision` as a placeable model, or the `HubError` that says why not."""
    cache = RepoCache(config.cache_dir, repo_id)
    if config.offline:
        return _from_cache(cache, revision, config.max_json_bytes)
    try:
        listing = list_remote(
            repo_id,
            revision,
            endpoint=config.endpoint,
            timeout=config.request_timeout,
            max_bytes=config.max_json_bytes,
        )
    except HubUnreachable as exc:
        try:
            model = _from_cache(cache, revision, config.max_json_bytes)
        except NotOnDisk:
            raise exc from None
        log.warning("%s; using %s as this node's cache has it", exc, model.source)
        return model
    if listing.file(CONFIG_FILE) is None:
        raise NotAModel(f"{repo_id} has no {CONFIG_FILE}: it is not an mlx-lm model")
    if listing.weight_bytes == 0:
        raise NotAModel(f"{repo_id} has no .safetensors weights for mlx-lm")
    # The config (its layout) and the index (which file holds which layer; the total size
    # when offline) are small; every node that runs the model fetches them anyway.
    for name in (CONFIG_FILE, WEIGHT_INDEX):
        if (file := listing.file(name)) is None:
            continue
        if file.size > config.max_json_bytes:
            raise UnsafeHubData(
                f"{repo_id}'s {name} is larger than {config.max_json_bytes} bytes "
                f"({file.size} listed): not fetched"
            )
        try:
            fetch_file(
                cache,
                listing.commit,
                file,
                endpoint=config.endpoint,
                on_bytes=lambda _: None,
                chunk_bytes=config.chunk_bytes,
            )
        except CorruptDownload as exc:  # its bytes are gone: the next look fetches it again
            raise HubUnreachable(f"{exc}; retry") from exc
    cache.record_ref(revision, listing.commit)
    return _model_ref(cache, listing, listing.weight_bytes, config.max_json_bytes)


def cached_model(
    cache: RepoCache, revision: str = DEFAULT_REVISION, max_json_bytes: int = MAX_HUB_JSON_BYTES
) -> ModelRef:
    """The model as this node's cache has it at `revision`, or at its newest snapshot."""
    if cache.commit_of(revision) is None:
        snapshots = sorted(
            (p for p in (cache.folder / "snapshots").glob("*") if p.is_dir()),
            key=_mtime,
        )
        if snapshots:
            revision = snapshots[-1].name
    return _from_cache(cache, revision, max_json_bytes)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # gone meanwhile
        return 0.0


def _from_cache(cache: RepoCache, revision: str, max_json_bytes: int) -> ModelRef:
    listing = list_cached(cache, revision)
    if listing.file(CONFIG_FILE) is None:
        raise NotOnDisk(
            f"offline, and this node's Hugging Face cache ({cache.root}) has no "
            f"{CONFIG_FILE} of {cache.repo_id}"
        )
    size = _cached_weight_bytes(cache, listing, max_json_bytes)
    if size <= 0:
        raise NotOnDisk(
            f"this node's Hugging Face cache ({cache.root}) has no weights of {cache.repo_id}, "
            f"nor an index that says how large they are"
        )
    return _model_ref(cache, listing, size, max_json_bytes)


def _cached_weight_bytes(cache: RepoCache, listing: RepoListing, max_json_bytes: int) -> int:
    """The weights' size: the index's `total_size` (the snapshot may hold only some files),
    else the weight files it holds."""
    try:
        index = read_json_object(
            cache.pointer(listing.commit, WEIGHT_INDEX), max_bytes=max_json_bytes
        )
        total = index["metadata"]["total_size"]
        if isinstance(total, int) and total > 0:
            return total
    except (OSError, ValueError, KeyError, TypeError):  # BadJsonFile is a ValueError
        pass
    return sum(f.size for f in listing.files if is_weight_file(f.name))


def _model_ref(cache: RepoCache, listing: RepoListing, size: int, max_json_bytes: int) -> ModelRef:
    config = _read_config(cache, listing.commit, max_json_bytes)
    return ModelRef(
        model_id=listing.repo_id,
        source=HubRevision(listing.repo_id, listing.commit).source,
        size_bytes=size,
        created=listing.created,
        layout=layout_of(config),
    )


def _read_config(cache: RepoCache, commit: str, max_json_bytes: int) -> dict[str, Any]:
    try:
        return read_json_object(cache.pointer(commit, CONFIG_FILE), max_bytes=max_json_bytes)
    except BadJsonFile as exc:
        raise NotAModel(f"{cache.repo_id}: {exc}") from None
    except OSError as exc:
        raise NotAModel(f"{cache.repo_id}: unreadable {CONFIG_FILE}: {exc}") from exc
