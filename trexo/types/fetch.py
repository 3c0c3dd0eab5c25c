"""What a node asks of its download process, and what the process tells it (JSON lines)."""

from __future__ import annotations

import attrs

from trexo.types.shard import ShardSpec


@attrs.frozen
class FetchJob:
    """Fetch what `shard` of `repo_id` at `revision` needs (None: the whole model)."""

    repo_id: str
    revision: str
    shard: ShardSpec | None
    cache_dir: str
    endpoint: str
    offline: bool
    chunk_bytes: int
    progress_interval: float
    disk_margin: int
    request_timeout: float
    max_json_bytes: int
    """The largest listing or weight index read (see `HubConfig.max_json_bytes`)."""


@attrs.frozen
class FetchPlanned:
    """The files it will have, and how many of their bytes are on disk already."""

    commit: str
    files: tuple[str, ...]
    total_bytes: int
    done_bytes: int


@attrs.frozen
class FetchProgress:
    done_bytes: int


@attrs.frozen
class FetchDone:
    """Every file is in the snapshot directory `snapshot`."""

    commit: str
    snapshot: str


@attrs.frozen
class FetchFailed:
    """`error` names a `trexo.errors.HubError` class (see `HUB_ERRORS`)."""

    error: str
    message: str


FetchEvent = FetchPlanned | FetchProgress | FetchDone | FetchFailed
