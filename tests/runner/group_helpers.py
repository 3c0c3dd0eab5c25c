"""Helpers for tests that run a split model over real runner processes on loopback."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path

import trio

from trexo.config import RunnerConfig
from trexo.types.chunks import Chunk
from trexo.types.ids import RunnerId
from trexo.types.runner_status import RunnerIdle
from trexo.types.shard import RankGroup, Sharding, ShardSpec
from trexo.worker.runner_supervisor import RunnerSupervisor

from .helpers import TEST_TIMEOUT_S

LOOPBACK = "127.0.0.1"
GROUP_CONFIG = RunnerConfig(
    shutdown_grace=0.5,
    term_grace=0.5,
    kill_grace=5.0,
    group_init_timeout=15.0,
    group_stall_timeout=3.0,
    prefill_step=8,  # several prefill chunks per prompt: exercises the send tied into the cache
)
EXIT_BOUND_S = 5.0
"""Generous: how long every rank may take to exit by itself after its group broke."""


def free_ports(count: int) -> list[int]:
    """Ports free on loopback right now (held together, so they are distinct)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in socks]


def loopback_group(world_size: int, epoch: int = 0) -> RankGroup:
    return RankGroup(epoch, tuple(f"{LOOPBACK}:{port}" for port in free_ports(world_size)))


def layer_count(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    return int((config.get("text_config") or config)["num_hidden_layers"])


def rank_shards(n_layers: int, world_size: int, sharding: Sharding) -> list[ShardSpec]:
    """Rank 0 first layers, as evenly as can be (tensor: every rank every layer)."""
    if sharding == "tensor":
        return [ShardSpec(0, n_layers, rank, world_size, "tensor") for rank in range(world_size)]
    base, extra = divmod(n_layers, world_size)
    shards, start = [], 0
    for rank in range(world_size):
        end = start + base + (1 if rank < extra else 0)
        shards.append(ShardSpec(start, end, rank, world_size, "pipeline"))
        start = end
    return shards


def group_supervisors(
    tmp_path: Path,
    world_size: int,
    *,
    config: RunnerConfig = GROUP_CONFIG,
    envs: Sequence[dict[str, str] | None] | None = None,
) -> list[RunnerSupervisor]:
    return [
        RunnerSupervisor(
            RunnerId(f"rank-{rank}"),
            config=config,
            log_dir=tmp_path / "logs",
            env=envs[rank] if envs else None,
        )
        for rank in range(world_size)
    ]


async def load_in_rank_order(
    supervisors: Sequence[RunnerSupervisor],
    model_dir: Path,
    shards: Sequence[ShardSpec],
    group: RankGroup,
) -> None:
    """Load every rank at once, each starting to join only once the rank before it has
    (rank 0 first: the ring then connects at once, instead of after a retry a second later)."""
    async with trio.open_nursery() as nursery:
        for supervisor, shard in zip(supervisors, shards, strict=True):
            nursery.start_soon(supervisor.load, model_dir, shard, group)
            await supervisor.wait_status(lambda s: not isinstance(s, RunnerIdle))


class Ranks(list[RunnerSupervisor]):
    """The ranks' supervisors in rank order; `stop(rank)` stops one of them alone."""

    def __init__(self, supervisors: list[RunnerSupervisor], scopes: list[trio.CancelScope]):
        super().__init__(supervisors)
        self._scopes = scopes

    def stop(self, rank: int) -> None:
        self._scopes[rank].cancel()


async def _run_in_scope(
    supervisor: RunnerSupervisor,
    scope: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[RunnerSupervisor] = trio.TASK_STATUS_IGNORED,
) -> None:
    with scope:
        await supervisor.run(task_status=task_status)


@asynccontextmanager
async def running_group(
    tmp_path: Path,
    model_dir: Path,
    world_size: int,
    sharding: Sharding = "pipeline",
    *,
    config: RunnerConfig = GROUP_CONFIG,
    envs: Sequence[dict[str, str] | None] | None = None,
    hang_bound: float = TEST_TIMEOUT_S,
) -> AsyncIterator[Ranks]:
    """`world_size` runners serving one split model; all stopped and reaped on exit.
    `hang_bound` catches hangs only: the whole block, start to stop."""
    with trio.fail_after(hang_bound):
        async with trio.open_nursery() as nursery:
            supervisors = group_supervisors(tmp_path, world_size, config=config, envs=envs)
            ranks = Ranks(supervisors, [trio.CancelScope() for _ in supervisors])
            for supervisor, scope in zip(supervisors, ranks._scopes, strict=True):
                await nursery.start(_run_in_scope, supervisor, scope)
            shards = rank_shards(layer_count(model_dir), world_size, sharding)
            await load_in_rank_order(supervisors, model_dir, shards, loopback_group(world_size))
            yield ranks
            nursery.cancel_scope.cancel()


def tokens_of(chunks: Sequence[Chunk]) -> list[int]:
    return [token for chunk in chunks for token in chunk.token_ids]
