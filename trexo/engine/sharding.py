"""Split models: join an `mx.distributed` ring group, keep one rank's part of a model.

Pipeline parallel (mlx-lm decoders that keep their blocks in `model.layers`,
`model.model.layers` or a vision-language wrapper's `language_model.model.layers`): rank r
keeps the blocks `[start_layer, end_layer)`, receives the hidden state from rank r-1 before
its first block and sends it to rank r+1 after its last; the other blocks stay in the list as
weightless `SkippedBlock`s, so every index-based choice of the model stays global
(`pipeline_part`), and cuts the architecture cannot take are refused
(`trexo.engine.pipeline_cuts`). Where the
model's edges are where mlx-lm's llama-style decoders keep them (`embed_tokens`, `norm`,
`lm_head` or a head tied to the embedding), only rank 0 holds the embedding and only the last
rank the final norm and head: the last rank samples each token and one `all_gather` of a
token per rank gives it to every rank (`sampled_on_last_rank`), so every rank steps with the
same token. Other decoders keep every edge on every rank and `all_gather` the last rank's
hidden state. Tensor parallel: `trexo.engine.tensor_split`.

Everything here runs on the runner's compute thread (MLX streams are per thread).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

import mlx.core as mx
from mlx.nn.layers.base import Module
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import ArraysCache, CacheList, _BaseCache

from trexo.engine.pipeline_cuts import layer_range_refusal
from trexo.engine.tensor_split import tensor_part
from trexo.engine.wrapped_module import Wrapping
from trexo.types.shard import RankGroup, ShardSpec

log = logging.getLogger(__name__)

T = TypeVar("T")

RING_BACKEND = "ring"
RANK_ENV = "MLX_RANK"
HOSTFILE_ENV = "MLX_HOSTFILE"


class GroupBroken(Exception):
    """A collective failed (a peer rank left): this group cannot step any more."""


def hostfile_entries(hosts: tuple[str, ...]) -> list[list[str]]:
    """The ring backend's hostfile: one `["ip:port"]` list per rank, in rank order."""
    return [[host] for host in hosts]


def join_group(group: RankGroup, rank: int, give_up_after: float) -> Any:
    """`mx.distributed.init` as rank `rank` of `group`; the `mx.distributed.Group`.

    `init` blocks, holding the GIL, until every peer has connected: nothing in this process
    can run meanwhile, not even the code that would notice that the parent left. So a
    process-wide timer kills the process (SIGALRM, whose default action is to terminate)
    if `init` has not returned after `give_up_after` seconds. The parent's own, shorter,
    bound normally acts first; this one holds when the parent is gone.
    """
    world_size = len(group.hosts)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a group of {world_size}")
    with tempfile.NamedTemporaryFile(
        "w", prefix="trexo-hosts-", suffix=".json", delete=False
    ) as hostfile:
        json.dump(hostfile_entries(group.hosts), hostfile)
    try:
        # The ring backend reads both at `init` (C++ getenv; os.environ writes through).
        os.environ[RANK_ENV] = str(rank)
        os.environ[HOSTFILE_ENV] = hostfile.name
        signal.setitimer(signal.ITIMER_REAL, give_up_after)
        try:
            world = mx.distributed.init(backend=RING_BACKEND, strict=True)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        os.unlink(hostfile.name)
    if (world.rank(), world.size()) != (rank, world_size):
        raise RuntimeError(
            f"joined as rank {world.rank()} of {world.size()}, expected {rank} of {world_size}"
        )
    return world


# --- one rank's part of a model ------------------------------------------------------------


def shard_model(model: Any, config: dict[str, Any], shard: ShardSpec, world: Any) -> SamplerWrap:
    """Cut the lazily loaded `model` down to this rank's part, in place, before evaluation;
    how this rank's samplers must be wrapped (every sampler of a generation, warm-up too).

    Weights that are dropped here are never read from disk.
    """
    if shard.world_size != world.size() or shard.rank != world.rank():
        raise ValueError(
            f"shard is rank {shard.rank} of {shard.world_size}, "
            f"but the group has this process as rank {world.rank()} of {world.size()}"
        )
    if shard.sharding == "tensor":
        _tensor_shard(model, config, shard, world)
        return _as_is  # every rank computes the whole logits and samples with the same seed
    return _pipeline_shard(model, config, shard, world)


def _tensor_shard(model: Any, config: dict[str, Any], shard: ShardSpec, world: Any) -> None:
    blocks = _block_holder(model).layers
    if (shard.start_layer, shard.end_layer) not in ((None, None), (0, len(blocks))):
        raise ValueError(
            f"a tensor shard holds every layer [0, {len(blocks)}), "
            f"not [{shard.start_layer}, {shard.end_layer})"
        )
    tensor_part(model, blocks, config, world)


def _block_holder(model: Any) -> Any:
    """The module whose `layers` list holds the transformer blocks: the model itself, its
    `model`, or a vision-language wrapper's `language_model` (or its `model`). A `layers`
    property (wrappers expose their text model's blocks so) is not a holder: the blocks are
    kept, and must be replaced, where the list is an attribute."""
    for holder in _text_models(model):
        if isinstance(holder.get("layers"), list):
            return holder
    raise ValueError(
        f"{type(model).__module__} models keep no list of blocks in model.layers, "
        "model.model.layers or model.language_model.model.layers: "
        "they cannot be split across ranks"
    )


def _text_models(model: Any) -> list[Module]:
    """Where a decoder's parts may live, outermost first: `model`, its `language_model`
    (a vision-language wrapper's text decoder) and each one's `model`."""
    found: list[Module] = []
    for outer in (model, model.get("language_model") if isinstance(model, Module) else None):
        if isinstance(outer, Module):
            inner = outer.get("model")
            found += [outer, *([inner] if isinstance(inner, Module) else [])]
    return found


def _head_holder(model: Any) -> Any:
    """The module that holds an untied `lm_head`, if any (the text decoder: a wrapper's
    `language_model`, else the model itself)."""
    for outer in _text_models(model):
        if isinstance(outer.get("lm_head"), Module):
            return outer
    return None


Sampler = Callable[[mx.array], mx.array]
SamplerWrap = Callable[[Sampler], Sampler]
"""How a rank's sampler must be wrapped so that every rank of its group gets the same token."""


def _as_is(sampler: Sampler) -> Sampler:
    return sampler


class Links(Protocol):
    """How a pipeline rank exchanges hidden states with its neighbours (`RingLinks`; the
    tests pass arrays between ranks simulated in one process)."""

    rank: int
    size: int

    def receive(self, like: mx.array) -> mx.array:
        """The hidden state from rank r-1, shaped like `like`."""
        ...

    def send(self, hidden: mx.array) -> mx.array:
        """`hidden`, which when evaluated is sent to rank r+1."""
        ...

    def last_ranks(self, hidden: mx.array) -> mx.array:
        """The last rank's `hidden`, on every rank."""
        ...


class RingLinks:
    """`Links` through an `mx.distributed.Group`."""

    def __init__(self, world: Any) -> None:
        self.world = world
        self.rank: int = world.rank()
        self.size: int = world.size()

    def receive(self, like: mx.array) -> mx.array:
        return mx.distributed.recv_like(like, self.rank - 1, group=self.world)

    def send(self, hidden: mx.array) -> mx.array:
        return mx.distributed.send(hidden, self.rank + 1, group=self.world)

    def last_ranks(self, hidden: mx.array) -> mx.array:
        return mx.distributed.all_gather(hidden, group=self.world)[-hidden.shape[0] :]


def _pipeline_shard(
    model: Any, config: dict[str, Any], shard: ShardSpec, world: Any
) -> SamplerWrap:
    split_edges = pipeline_part(model, config, shard, RingLinks(world))
    return (lambda sampler: sampled_on_last_rank(sampler, world)) if split_edges else _as_is


def pipeline_part(model: Any, config: dict[str, Any], shard: ShardSpec, links: Links) -> bool:
    """Cut `model` down to rank `links.rank`'s pipeline part, in place; whether its edges
    are split (only rank 0 embeds, only the last rank computes the head: then its samplers
    must be wrapped with `sampled_on_last_rank`).

    The list of blocks keeps its full length and every block its global index: the blocks
    of other ranks are replaced by weightless `SkippedBlock`s. So everything a model chooses
    by a block's index (sliding or global attention, the kind of cache `make_cache` builds,
    the mask a layer gets, a hybrid model's pattern position) is chosen as in the whole
    model, whatever the architecture, and only the local blocks hold weights and run.
    """
    holder = _block_holder(model)
    blocks: list[Any] = holder.layers
    start, end = shard.start_layer, shard.end_layer
    if start is None or end is None or not 0 <= start < end <= len(blocks):
        raise ValueError(
            f"a pipeline shard needs layers [start, end) within [0, {len(blocks)}), "
            f"not [{start}, {end})"
        )
    if refusal := layer_range_refusal(config, start, end):
        raise ValueError(refusal)
    is_first, is_last = links.rank == 0, links.rank == links.size - 1
    split_edges = _has_known_edges(holder)
    gather = not split_edges  # then every rank computes the logits from the same hidden state
    local: list[Any] = blocks[start:end]
    if len(local) == 1:
        local = [
            PipelineEdge(local[0], links, receive=not is_first, send=not is_last, gather=gather)
        ]
    else:
        first = PipelineEdge(local[0], links, receive=not is_first, send=False, gather=False)
        last = PipelineEdge(local[-1], links, receive=False, send=not is_last, gather=gather)
        local = [first, *local[1:-1], last]
    # The other blocks' lazily loaded weights go with the old list: never read from disk.
    holder.layers = [
        *(SkippedBlock(block) for block in blocks[:start]),
        *local,
        *(SkippedBlock(block) for block in blocks[end:]),
    ]
    if split_edges:
        _keep_own_edges(model, holder, is_first=is_first, is_last=is_last)
    log.info(
        "pipeline rank %d of %d: layers [%d, %d)%s",
        links.rank,
        links.size,
        start,
        end,
        _edges_held(is_first, is_last) if split_edges else ", every edge (all_gather)",
    )
    return split_edges


def _edges_held(is_first: bool, is_last: bool) -> str:
    held = [name for name, kept in (("embedding", is_first), ("norm and head", is_last)) if kept]
    return ", " + " and ".join(held) if held else ", no embedding, norm or head"


def _has_known_edges(holder: Any) -> bool:
    """The embedding is `embed_tokens` beside the blocks, and the head `lm_head` or tied to it
    (`embed_tokens.as_linear`): the shape of mlx-lm's llama-style decoders."""
    embedding = holder.get("embed_tokens")
    return isinstance(embedding, Module) and callable(getattr(embedding, "as_linear", None))


def _keep_own_edges(model: Any, holder: Any, *, is_first: bool, is_last: bool) -> None:
    """Replace the edges this rank does not compute by weightless stand-ins, in place.

    A stand-in gives what the model's own code expects (an embedding of the right shape and
    dtype, logits of the right width) without weights, and its logits depend on the hidden
    state, so that evaluating a step still runs this rank's blocks and their send.
    Decoders that feed every block an input computed from the token embedding (gemma 4's
    per-layer inputs, `embed_tokens_per_layer`) keep the embedding on every rank.
    """
    embedding: Module = holder["embed_tokens"]
    # Lazily: the dtype and width of what the real modules would give, reading no weights.
    hidden = embedding(mx.zeros((1, 1), mx.int32))
    head_holder = _head_holder(model)
    untied = head_holder is not None
    head_width = int((head_holder["lm_head"] if untied else embedding).weight.shape[0])
    if not is_last:
        if isinstance(holder.get("norm"), Module):
            holder.norm = PassThrough()
        if untied:
            head_holder.lm_head = AbsentHead(head_width)
    tied_head_needed = is_last and not untied
    embedding_needed = is_first or isinstance(holder.get("embed_tokens_per_layer"), Module)
    if embedding_needed:
        if not is_last and not untied:
            holder.embed_tokens = HeadlessEmbedding(embedding, head_width)
    elif not tied_head_needed:
        # Its input comes from rank r-1; the real lookup's output would only be replaced.
        holder.embed_tokens = AbsentEmbedding(hidden.shape[-1], hidden.dtype, head_width)


def placeholder_logits(hidden: mx.array, width: int) -> mx.array:
    """Zero logits for the last position only, depending on `hidden` (see `_keep_own_edges`).

    mlx-lm reads only the last position's logits of a step; a prefill chunk's are never
    evaluated. Broadcast zeros: no memory of the width's size until something reads them.
    """
    zeros = mx.broadcast_to(mx.array(0, hidden.dtype), (hidden.shape[0], 1, width))
    return cast(mx.array, mx.depends(zeros, hidden))


class PassThrough(Module):
    """The final norm on a rank that does not compute the head."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]

    def __call__(self, x: mx.array) -> mx.array:
        return x


class AbsentHead(Module):
    """An untied head on a rank that does not sample."""

    def __init__(self, width: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._width = width

    def __call__(self, x: mx.array) -> mx.array:
        return placeholder_logits(x, self._width)


class HeadlessEmbedding(Module):
    """Rank 0's embedding when the head is tied to it and another rank computes the head."""

    def __init__(self, embedding: Module, head_width: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.embedding = embedding
        self._head_width = head_width

    def __call__(self, ids: mx.array) -> mx.array:
        return cast(mx.array, self.embedding(ids))

    def as_linear(self, x: mx.array) -> mx.array:
        return placeholder_logits(x, self._head_width)


class AbsentEmbedding(Module):
    """The embedding on a rank that receives its input from rank r-1: the shape and dtype of
    the real output, never evaluated (the first block's receive replaces it)."""

    def __init__(self, hidden_size: int, dtype: mx.Dtype, head_width: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._hidden_size = hidden_size
        self._dtype = dtype
        self._head_width = head_width

    def __call__(self, ids: mx.array) -> mx.array:
        return mx.zeros((*ids.shape, self._hidden_size), self._dtype)

    def as_linear(self, x: mx.array) -> mx.array:
        return placeholder_logits(x, self._head_width)


def sampled_on_last_rank(sampler: Sampler, world: Any) -> Sampler:
    """`sampler` on the last rank, whose token every rank gets (an `all_gather` of one
    token per rank, of which the last rank's is kept: measured ~25 % less time per token
    in a 2-rank pipeline than an `all_sum` of the same scalar).

    The other ranks hold placeholder logits: their 0 depends on their logits, so that the
    step's forward pass and its send run before the collective.
    """
    is_last = world.rank() == world.size() - 1

    def sample(logprobs: mx.array) -> mx.array:
        if is_last:
            token = sampler(logprobs).astype(mx.int32)
        else:
            token = cast(mx.array, mx.depends(mx.zeros(logprobs.shape[:-1], mx.int32), logprobs))
        return mx.distributed.all_gather(token, group=world)[-token.shape[0] :]

    return sample


class PipelineEdge(Wrapping):
    """A block at the edge of a rank's layer range: receive before it, send after it.

    `receive`: replace the block's input by the hidden state from rank r-1. `send`: send the
    output to rank r+1, tied into the block's cache with `mx.depends`, because a prefill
    step evaluates only the caches: without the tie the send never runs and rank r+1 waits
    forever (the `SkippedBlock`s after it tie it into theirs too). `gather`: keep the last
    rank's output, the model's output (for decoders whose edges every rank holds).
    Other attributes (`use_sliding`, ...) are the block's.
    """

    INNER = "block"

    def __init__(self, block: Any, links: Links, *, receive: bool, send: bool, gather: bool):
        super().__init__()  # type: ignore[no-untyped-call]
        self.block = block
        self._links = links
        self._receive = receive
        self._send = send
        self._gather = gather

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> Any:
        if self._receive:
            x = self._links.receive(x)
        out = self.block(x, *args, **kwargs)
        # Some blocks return more than the hidden state (gemma 4: its keys and values too).
        h: mx.array = out[0] if isinstance(out, tuple) else out
        if self._send:
            h = self._links.send(h)
            for cache in _caches_in(args, kwargs):
                _tie_into_cache(cache, h)
        if self._gather:
            h = self._links.last_ranks(h)
        return (h, *out[1:]) if isinstance(out, tuple) else h


class SkippedBlock(Module):
    """Another rank's block: its input passes through, and its cache advances as the real
    block's would, holding one zero per position in place of keys and values.

    So what the model reads from a cache to build masks (offsets, a rotating cache's
    position, a batch's padding) is what it would be in the whole model, whichever layer's
    cache it reads, and the batch operations (merge, filter, extract, trim) find a cache
    that has seen every token. The zeros depend on the input: behind a `send`, they tie it
    into the caches a prefill step evaluates. The block's plain attributes (`layer_type`,
    `self_attn.is_local`, ...), which models read to build caches and masks, are kept in
    weightless stand-ins (`_shadow`).
    """

    def __init__(self, block: Any) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        _copy_plain_attributes(block, self)
        self._returns_tuple = _returns_shared_kv(block)
        self._advances = _advances_its_cache(block)

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> Any:
        for cache in _caches_in(args, kwargs):
            _advance_skipped(cache, x, advance=self._advances)
        # gemma 4's blocks return (hidden, keys and values, offset): another rank's are never
        # read here (`trexo.engine.pipeline_cuts` refuses cuts that would need them).
        return (x, None, None) if self._returns_tuple else x


class _Shadow(Module):
    """A weightless stand-in for a sub-module of a `SkippedBlock`: its plain attributes."""

    def __init__(self, module: Module) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        _copy_plain_attributes(module, self)


def _copy_plain_attributes(source: Module, target: Module) -> None:
    for name, value in vars(source).items():
        if not name.startswith("_") and not isinstance(value, mx.array):
            object.__setattr__(target, name, value)
    for name, child in source.items():
        if isinstance(child, Module):
            setattr(target, name, _Shadow(child))


def _returns_shared_kv(block: Any) -> bool:
    """gemma 4's blocks take and return the keys and values they share with later blocks."""
    try:
        parameters = inspect.signature(type(block).__call__).parameters
    except (TypeError, ValueError):
        return False
    return "shared_kv" in parameters


def _caches_in(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The caches among a block's arguments (models pass it by position or by name)."""
    return [value for value in (*args, *kwargs.values()) if isinstance(value, _BaseCache)]


def _advances_its_cache(block: Any) -> bool:
    """Whether the block's state-space layer moves its `ArraysCache`'s batch lengths on
    itself (`cache.advance`: granitemoehybrid, falcon_h1; qwen3_next and lfm2 do not), read
    from its module's source: the skipped block must do as the real one would."""
    try:
        source = inspect.getsource(sys.modules[type(block).__module__])
    except (KeyError, OSError, TypeError):
        return False
    return ".advance(" in source


def _advance_skipped(cache: Any, x: mx.array, *, advance: bool) -> None:
    batch, length = x.shape[0], x.shape[1]
    if isinstance(cache, CacheList):
        for inner in cache.caches:
            _advance_skipped(inner, x, advance=advance)
    elif isinstance(cache, ArraysCache):
        # A state-space layer's state: one zero per sequence (merge, filter and extract
        # need an array), and the length bookkeeping its own layer would do.
        for index, state in enumerate(cache.cache):
            zero = state if state is not None else mx.zeros((batch, 1), x.dtype)
            cache[index] = cast(mx.array, mx.depends(zero, x))
        if advance:
            cache.advance(length)  # type: ignore[no-untyped-call]
    elif callable(getattr(cache, "update_and_fetch", None)):
        zeros = cast(mx.array, mx.depends(mx.zeros((batch, 1, length, 1), x.dtype), x))
        cache.update_and_fetch(zeros, zeros)


def _tie_into_cache(cache: Any, sent: mx.array) -> None:
    if isinstance(cache, CacheList):
        for inner in cache.caches:
            _tie_into_cache(inner, sent)
    elif isinstance(cache, ArraysCache):
        for index, state in enumerate(cache.cache):
            if isinstance(state, mx.array):
                cache[index] = cast(mx.array, mx.depends(state, sent))
    elif isinstance(keys := getattr(cache, "keys", None), mx.array):
        cache.keys = mx.depends(keys, sent)


# --- the control channel: what rank 0 decides, every rank learns -----------------------------


class Watch(Protocol):
    """Told when the compute thread starts waiting on its peers and when it heard from them."""

    def waiting(self) -> None: ...

    def heard(self) -> None: ...


class GroupLink:
    """Rank 0's decisions shared with every rank, through the group itself (`all_sum`).

    Every rank calls the same methods in the same order; rank 0's arguments are what all
    of them get back, together with whether any rank is leaving (its parent stops it): then
    every rank leaves at that same step, and none waits on a peer that is gone. Collectives
    run on mlx-lm's generation stream, behind any step it has queued, so the ring sees every
    rank's collectives in one order. Any failure of a collective raises `GroupBroken`: a
    peer left, and the ranks cannot get back in step.
    """

    def __init__(self, world: Any, watch: Watch) -> None:
        self.world = world
        self.rank: int = world.rank()
        self.size: int = world.size()
        self._watch = watch

    @property
    def is_lead(self) -> bool:
        return self.rank == 0

    def share_bytes(self, payload: bytes, *, leaving: bool) -> tuple[bytes, bool]:
        """Rank 0's `payload` (others pass b"") and whether any rank is leaving.

        One collective of two scalars; a second one carries a non-empty payload, unless a
        rank is leaving (then b"" comes back: nothing more is done in this group).
        """
        mine = payload if self.is_lead else b""
        size, leavers = self._sum_ints(len(mine), int(leaving))
        if not size or leavers:
            return b"", bool(leavers)
        data = mx.array(list(mine), mx.uint8) if self.is_lead else mx.zeros(size, mx.uint8)
        return bytes(cast(list[int], self._collective(lambda: self._sum(data).tolist()))), False

    def share_flags(self, *, stop: bool, leaving: bool) -> tuple[bool, bool]:
        """Rank 0's `stop` and whether any rank is leaving: one collective of two scalars."""
        stops, leavers = self._sum_ints(int(stop and self.is_lead), int(leaving))
        return bool(stops), bool(leavers)

    def _sum_ints(self, *values: int) -> list[int]:
        mine = mx.array(values, mx.int32)
        return cast(list[int], self._collective(lambda: self._sum(mine).tolist()))

    def barrier(self) -> None:
        """Wait for every rank, however long (a peer still loading its weights)."""
        self._collective(lambda: self._sum(mx.array(1, dtype=mx.int32)).item(), watched=False)

    def _sum(self, value: mx.array) -> mx.array:
        # Let what mlx-lm queued (the next step, with its collectives) finish first: if one
        # of those fails, the error surfaces here. A collective submitted after the ring gave
        # up on a dead peer neither completes nor raises. The all_sum would wait for them
        # anyway: it runs behind them on this stream.
        mx.synchronize(generation_stream)
        total = mx.distributed.all_sum(value, group=self.world, stream=generation_stream)
        mx.eval(total)
        return total

    def _collective(self, run: Callable[[], T], *, watched: bool = True) -> T:
        if watched:
            self._watch.waiting()
        try:
            result = run()
        except Exception as exc:  # the ring raises RuntimeError ~5 ms after a peer died
            raise GroupBroken(str(exc)) from exc
        self._watch.heard()
        return result
