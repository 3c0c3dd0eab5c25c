"""Messages between a node (parent) and its runner processes, over a socketpair."""

from __future__ import annotations

import attrs

from trexo.config import (
    DEFAULT_MAX_BATCH,
    DEFAULT_PREFILL_STEP_TOKENS,
    GROUP_IDLE_TICK_S,
    GROUP_INIT_TIMEOUT_S,
    GROUP_STALL_TIMEOUT_S,
    PROMPT_CACHE_BYTES,
)
from trexo.types.chunks import Chunk
from trexo.types.failure import FailureKind
from trexo.types.generation import GenerationRequest
from trexo.types.ids import RequestId
from trexo.types.runner_status import RunnerStatus
from trexo.types.shard import RankGroup, ShardSpec

# --- parent -> runner ----------------------------------------------------------------------


@attrs.frozen
class LoadModel:
    model_dir: str
    shard: ShardSpec = ShardSpec()
    prefill_step: int = DEFAULT_PREFILL_STEP_TOKENS
    """Prompt tokens per prefill chunk; a cancel takes effect between chunks."""
    group: RankGroup | None = None
    """Set for one rank of a split model: join this group as rank `shard.rank` first
    (the runner then serves this group for the rest of its life)."""
    group_init_timeout: float = GROUP_INIT_TIMEOUT_S
    """The parent gives up on the group after this; the runner itself, a little later."""
    group_stall_timeout: float = GROUP_STALL_TIMEOUT_S
    group_idle_tick: float = GROUP_IDLE_TICK_S
    max_batch: int = DEFAULT_MAX_BATCH
    """Generations stepped together; more wait their turn."""
    prompt_cache_bytes: int = PROMPT_CACHE_BYTES
    """Bound of the runner's prompt cache (0: none)."""


@attrs.frozen
class Generate:
    request: GenerationRequest


@attrs.frozen
class Cancel:
    request_id: RequestId


@attrs.frozen
class Shutdown:
    """Finish: stop generating, release the model, exit 0."""


ToRunner = LoadModel | Generate | Cancel | Shutdown

# --- runner -> parent ----------------------------------------------------------------------


@attrs.frozen
class StatusReport:
    status: RunnerStatus


@attrs.frozen
class ChunkMessage:
    chunk: Chunk


@attrs.frozen
class ChunkBatch:
    """The chunks of one batch step, one per generation: one frame, not one each."""

    chunks: tuple[Chunk, ...]


@attrs.frozen
class RequestFailed:
    """A request ended with an error; the runner itself carries on."""

    request_id: RequestId
    message: str
    kind: FailureKind = FailureKind.INTERNAL


@attrs.frozen
class JoiningGroup:
    """Posted as the rank starts to connect to its peers (`mx.distributed.init`), its own
    start-up done (the interpreter, MLX and mlx-lm imported): from here the group must form
    within the group's bound; before, a busy machine may take its time."""

    rank: int
    world_size: int


@attrs.frozen
class GroupJoined:
    """Posted as soon as `mx.distributed.init` returned: every rank of the group is up."""

    rank: int
    world_size: int


@attrs.frozen
class PromptCacheStats:
    """A runner's prompt cache: what it holds and how often it helped."""

    entries: int = 0
    nbytes: int = 0
    max_bytes: int = 0
    lookups: int = 0
    hits: int = 0
    cached_tokens: int = 0
    """Prompt tokens served from the cache instead of prefilled, over all lookups."""

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


@attrs.frozen
class CacheReport:
    """Sent after each generation ends: the prompt cache as it stands."""

    stats: PromptCacheStats


FromRunner = (
    StatusReport
    | ChunkMessage
    | ChunkBatch
    | RequestFailed
    | JoiningGroup
    | GroupJoined
    | CacheReport
)
