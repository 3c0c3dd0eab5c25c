"""Continuous batching: every generation of a runner stepped together by one mlx-lm
`BatchGenerator`, with a prompt cache that lets a conversation's next turn skip its history.

A `BatchEngine` is driven from the runner's one compute thread (MLX streams are per thread)
and knows nothing of trio. Requests join (`add`) and leave (`remove`) between steps; each
`step()` runs one decode step of every running generation and one prefill chunk (at most
`prefill_step` tokens) of every prompt being read, so a long prompt delays the running
streams by one chunk per step, never by its whole length.

Each request keeps its own sampler (with its own random key: a seeded request samples the
same tokens whatever else runs beside it), logits processors, stop sequences, `max_tokens`
and detokenizer. The tokenizer's EOS ids stop every request (mlx-lm's default stops none).

Rank r of a split model runs the same engine: every rank adds and removes the same requests
before the same step (rank 0 decides, `trexo.runner.lockstep`), and `share_tokens` makes
every rank's samplers agree.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.generate import BatchGenerator, generation_stream
from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, trim_prompt_cache
from mlx_lm.sample_utils import (
    apply_top_k,
    apply_top_p,
    greedy_sampler,
    make_logits_processors,
)

from trexo.engine.logprobs import token_logprob
from trexo.engine.output import OutputFormat, OutputReader, Released, output_reader
from trexo.engine.sharding import Sampler, SamplerWrap
from trexo.engine.structured_output import format_processor
from trexo.types.chunks import Chunk, FinishReason, TokenLogprob, Usage
from trexo.types.generation import GenerationRequest, SamplingParams
from trexo.types.ids import RequestId
from trexo.types.ipc import PromptCacheStats

log = logging.getLogger(__name__)

CACHE_KEY = "model"
"""The prompt cache's model key: one model per runner."""
SEED_BITS = 31
NOTHING = Released()


@attrs.define
class _Generation:
    request_id: RequestId
    prompt_tokens: int
    cached_tokens: int
    detokenizer: Any
    reader: OutputReader
    top_logprobs: int | None = None
    generated: int = 0
    reasoned: int = 0
    """Of the tokens generated, those of the reasoning (its markers included)."""


def check_sampling(params: SamplingParams) -> None:
    """`ValueError` naming the first sampling parameter mlx-lm would refuse mid-step.

    A sampler or logits processor that raises inside `step` fails every generation in the
    batch; checked here, before the request joins, a bad value is its own request's error.
    (The dialects check ranges too; a request from a peer has only this check.)"""
    checks = (
        (
            "temperature",
            params.temperature,
            math.isfinite(params.temperature) and params.temperature >= 0,
        ),
        ("top_p", params.top_p, 0.0 <= params.top_p <= 1.0),
        ("min_p", params.min_p, 0.0 <= params.min_p <= 1.0),
        ("top_k", params.top_k, params.top_k >= 0),
    )
    for name, value, ok in checks:
        if not ok:
            raise ValueError(f"{name} {value!r} is out of range")
    penalty = params.repetition_penalty
    if penalty is not None and not (math.isfinite(penalty) and penalty > 0):
        raise ValueError(f"repetition_penalty {penalty!r} is out of range")


@mx.compile
def _min_p(logprobs: mx.array, log_min_p: mx.array) -> mx.array:
    """mlx-lm's min-p filter (keep the tokens at least `min_p` times as likely as the most
    likely one), taking log(min_p) as an array: mlx-lm's checks its value as a float, and a
    compiled function compiles again for every new float."""
    threshold = mx.max(logprobs, axis=-1, keepdims=True) + log_min_p
    return mx.where(logprobs < threshold, -mx.inf, logprobs)


def _top_k(logprobs: mx.array, k: int) -> mx.array:
    # mlx-lm raises for k >= the vocabulary (mid-step, for the whole batch): keeping at least
    # every token filters nothing.
    return logprobs if k >= logprobs.shape[-1] else apply_top_k(logprobs, k)


def request_sampler(params: SamplingParams, seed: int | None) -> Sampler | None:
    """`params`' sampler with a random key of its own (None: greedy, the shared sampler).

    The same filters as mlx-lm's `make_sampler`, but each request draws from its own key
    (`mx.random.categorical(..., key=)`), so a seeded request samples the same tokens
    whatever else is in the batch. `params` passed `check_sampling`.
    """
    if params.temperature == 0:
        return None
    filters: list[Callable[[mx.array], mx.array]] = []
    # Values as arrays: a compiled filter given a Python float compiles again for each new
    # value (~1 s on a quiet 2-core machine, several when loaded, for every new top_p).
    if 0 < params.top_p < 1.0:
        top_p = mx.array(params.top_p, dtype=mx.float32)
        # Typed float by mlx-lm; it only multiplies it, and an array is what avoids compiles.
        filters.append(lambda x: apply_top_p(x, top_p))  # type: ignore[arg-type]
    if params.min_p != 0.0:
        log_min_p = mx.array(math.log(params.min_p), dtype=mx.float32)
        filters.append(lambda x: _min_p(x, log_min_p))
    if params.top_k > 0:
        filters.append(lambda x: _top_k(x, params.top_k))
    key = mx.random.key(seed if seed is not None else random.getrandbits(SEED_BITS))
    scale = 1 / params.temperature

    def sample(logprobs: mx.array) -> mx.array:
        nonlocal key
        key, draw = mx.random.split(key)
        for keep in filters:
            logprobs = keep(logprobs)
        return mx.random.categorical(logprobs * scale, key=draw)

    return sample


class BatchEngine:
    """Many generations of one loaded model, stepped together."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch: int,
        prefill_step: int,
        prompt_cache_bytes: int,
        share_tokens: SamplerWrap | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self._format = OutputFormat.of(tokenizer)
        self._share = share_tokens or (lambda sampler: sampler)
        eos = sorted(getattr(tokenizer, "eos_token_ids", None) or ())
        self._generator: Any = BatchGenerator(
            model,
            stop_tokens=[[token] for token in eos],
            sampler=self._share(greedy_sampler),
            completion_batch_size=max_batch,
            prefill_batch_size=max_batch,
            prefill_step_size=prefill_step,
            stream=generation_stream,
        )
        self._cache = LRUPromptCache(max_bytes=prompt_cache_bytes) if prompt_cache_bytes else None
        self._max_cache_bytes = prompt_cache_bytes
        self._running: dict[int, _Generation] = {}
        self._uids: dict[RequestId, int] = {}
        self._lookups = self._hits = self._cached_tokens = 0

    # --- what the runner asks -----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._running)

    def __contains__(self, request_id: RequestId) -> bool:
        return request_id in self._uids

    def cache_stats(self) -> PromptCacheStats:
        cache = self._cache
        return PromptCacheStats(
            entries=len(cache) if cache is not None else 0,
            nbytes=cache.nbytes if cache is not None else 0,
            max_bytes=self._max_cache_bytes,
            lookups=self._lookups,
            hits=self._hits,
            cached_tokens=self._cached_tokens,
        )

    def add(self, request: GenerationRequest, prompt: list[int]) -> None:
        """Start `request` (its `prompt` encoded and checked by the caller) at the next step.

        `ValueError` if its sampling parameters or response format cannot be used."""
        params = request.params
        check_sampling(params)
        processors = self._processors(request)
        cache, rest = self._cached_prefix(prompt)
        cached = len(prompt) - len(rest)
        sampler = request_sampler(params, params.seed)
        (uid,) = self._generator.insert(
            [rest],
            max_tokens=[params.max_tokens],
            caches=[cache] if cache is not None else None,
            all_tokens=[prompt[:cached]],
            samplers=[self._share(sampler)] if sampler is not None else None,
            logits_processors=[processors],
        )
        self._running[uid] = _Generation(
            request.request_id,
            len(prompt),
            cached,
            self._detokenizer(request, prompt),
            output_reader(self._format, self._tokenizer, request, prompt),
            request.logprobs,
        )
        self._uids[request.request_id] = uid

    def _detokenizer(self, request: GenerationRequest, prompt: list[int]) -> Any:
        """A fresh streaming detokenizer. mlx-lm's drops the leading space of an answer's
        first token; a continued turn's next word needs it, so that detokenizer is primed
        with the prompt's last token, whose text is then discarded."""
        detokenizer = self._tokenizer.detokenizer
        if request.continue_final:
            detokenizer.add_token(prompt[-1])
            _ = detokenizer.last_segment
        return detokenizer

    def _processors(self, request: GenerationRequest) -> list[Any]:
        """The request's logits processors; a response format's constraint last, so that
        nothing after it can undo its mask."""
        processors: list[Any] = make_logits_processors(
            repetition_penalty=request.params.repetition_penalty
        )
        if (fmt := request.response_format) is not None:
            processors.append(format_processor(self._tokenizer, fmt.kind, fmt.schema))
        return processors

    def remove(self, request_id: RequestId) -> Chunk | None:
        """End `request_id` now ("cancelled"): its final chunk, with the text held back."""
        uid = self._uids.get(request_id)
        if uid is None:
            return None
        self._keep_cache(self._generator.remove([uid], return_prompt_caches=True).get(uid))
        generation = self._forget(uid)
        generation.detokenizer.finalize()
        tail = self._ending(generation, generation.detokenizer.last_segment)
        return self._final(generation, tail, (), "cancelled")

    def step(self) -> list[Chunk]:
        """One step of every generation: a chunk per token generated, final ones last."""
        _, responses = self._generator.next()
        chunks: list[Chunk] = []
        ended: list[int] = []
        for response in responses:
            generation = self._running.get(response.uid)
            if generation is None:
                continue  # removed while its step was being computed ahead
            chunk = self._chunk(generation, response)
            chunks.append(chunk)
            if chunk.finish_reason is not None:
                if response.finish_reason is None:  # a stop string ended it: it still runs
                    ended.append(response.uid)
                else:
                    self._keep_cache((response.prompt_cache, response.all_tokens))
                self._forget(response.uid)
        if ended:
            caches = self._generator.remove(ended, return_prompt_caches=True)
            for cache in caches.values():
                self._keep_cache(cache)
        return chunks

    # --- inside ---------------------------------------------------------------------------------

    def _cached_prefix(self, prompt: list[int]) -> tuple[Any, list[int]]:
        """The cached KV state of the prompt's longest known prefix (a copy: generation
        mutates it) and the tokens still to prefill (at least one: its logits are needed)."""
        if self._cache is None:
            return None, prompt
        self._lookups += 1
        cache, rest = self._cache.fetch_nearest_cache(CACHE_KEY, prompt)
        if cache is not None and not rest:
            if not can_trim_prompt_cache(cache):
                return None, prompt
            trim_prompt_cache(cache, 1)
            rest = prompt[-1:]
        if cache is not None:
            self._hits += 1
            self._cached_tokens += len(prompt) - len(rest)
        return cache, list(rest)

    def _keep_cache(self, extracted: Any) -> None:
        if self._cache is None or extracted is None:
            return
        cache, tokens = extracted
        if cache is not None and tokens:
            self._cache.insert_cache(CACHE_KEY, list(tokens), cache)

    def _forget(self, uid: int) -> _Generation:
        generation = self._running.pop(uid)
        del self._uids[generation.request_id]
        return generation

    def _chunk(self, generation: _Generation, response: Any) -> Chunk:
        generation.generated += 1
        token_ids = (int(response.token),)
        logprobs: tuple[TokenLogprob, ...] = ()
        if generation.top_logprobs is not None:
            logprobs = (
                token_logprob(
                    self._tokenizer, response.logprobs, response.token, generation.top_logprobs
                ),
            )
        detokenizer = generation.detokenizer
        # On "stop" the token is the EOS, which carries no text.
        if response.finish_reason != "stop":
            detokenizer.add_token(response.token)
        if response.finish_reason is not None:
            detokenizer.finalize()
        reader = generation.reader
        reasoning = reader.reasoning
        released = reader.feed(detokenizer.last_segment)
        if reasoning or reader.reasoning:  # in the reasoning, or the marker opening it
            generation.reasoned += 1
        if released.stopped:
            return self._final(generation, released, token_ids, "stop", logprobs)
        if response.finish_reason is not None:
            reason: FinishReason = "stop" if response.finish_reason == "stop" else "length"
            ending = self._ending(generation, "", released)
            return self._final(generation, ending, token_ids, reason, logprobs)
        return Chunk(
            generation.request_id,
            released.text,
            token_ids,
            tool_calls=released.tool_calls,
            logprobs=logprobs,
            reasoning=released.reasoning,
        )

    @staticmethod
    def _ending(generation: _Generation, piece: str, before: Released = NOTHING) -> Released:
        """`before` and what the last `piece` and the end release (held text, an open call)."""
        released = generation.reader.feed(piece) if piece else NOTHING
        rest = NOTHING if released.stopped else generation.reader.finish()
        return before.then(released).then(rest)

    @staticmethod
    def _final(
        generation: _Generation,
        released: Released,
        token_ids: tuple[int, ...],
        reason: FinishReason,
        logprobs: tuple[TokenLogprob, ...] = (),
    ) -> Chunk:
        usage = Usage(
            prompt_tokens=generation.prompt_tokens,
            completion_tokens=generation.generated,
            cached_tokens=generation.cached_tokens,
            reasoning_tokens=generation.reasoned,
        )
        if reason == "stop" and generation.reader.calls_made:
            reason = "tool_calls"
        return Chunk(
            generation.request_id,
            released.text,
            token_ids,
            finish_reason=reason,
            usage=usage,
            tool_calls=released.tool_calls,
            logprobs=logprobs,
            stop_sequence=released.stop_sequence,
            reasoning=released.reasoning,
        )
