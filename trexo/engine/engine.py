"""Load a model with mlx-lm and stream generations from it, synchronously.

An `Engine` is driven from one dedicated compute thread (MLX streams are per thread) and knows
nothing of trio: the runner feeds it requests and passes a `should_stop` callable that reads
the flag its trio side sets. One generation at a time: seeding and the KV cache are per engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.generate import stream_generate
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_model, load_tokenizer

from trexo.config import DEFAULT_MAX_BATCH, DEFAULT_PREFILL_STEP_TOKENS
from trexo.engine.batch import BatchEngine
from trexo.engine.batch_limits import batch_limit
from trexo.engine.prompt import encode_prompt, read_context_length
from trexo.engine.sharding import Sampler, SamplerWrap, shard_model
from trexo.engine.tool_parsers import ToolFormat
from trexo.hub.files import WEIGHT_INDEX, missing_weight_files
from trexo.json_file import BadJsonFile, read_json_object
from trexo.types.chunks import Chunk, Usage
from trexo.types.generation import GenerationRequest, SamplingParams
from trexo.types.shard import ShardSpec

ProgressCallback = Callable[[float], None]

WEIGHTS_LOADED_PROGRESS = 0.9
"""Reading the weights is nearly all of a load; the tokenizer is the rest."""
WARMUP_PROMPT = "Hello"
WARMUP_TOKENS = 4


def _no_progress(_: float) -> None:
    pass


class _PrefillCancelled(Exception):
    """Raised from mlx-lm's prefill progress callback to abandon a cancelled prefill."""


def fitted_max_tokens(prompt_tokens: int, max_tokens: int, context: int) -> int:
    """`max_tokens`, capped to what `context` leaves after the prompt; `ValueError` naming the
    numbers if the prompt alone leaves no room. Clients send limits sized for large models
    (Anthropic's and Ollama's always send one): like mlx_lm.server, llama.cpp and Ollama,
    generate what fits and finish with "length" rather than refuse."""
    room = context - prompt_tokens
    if room < 1:
        raise ValueError(
            f"the prompt has {prompt_tokens} tokens: no room for a completion in the "
            f"model's context of {context}"
        )
    return min(max_tokens, room)


def _check_shard_files(model_dir: Path, shard: ShardSpec) -> None:
    """`FileNotFoundError` naming the weight files `shard` needs that `model_dir` lacks."""
    index_path = model_dir / WEIGHT_INDEX
    try:
        index = read_json_object(index_path)  # a hub's file: bounded, the hardened decoder
    except FileNotFoundError:
        index = None
    except BadJsonFile as exc:
        raise ValueError(f"{model_dir}: {exc}") from None
    present = [p.name for p in model_dir.iterdir() if p.exists()]
    if missing := missing_weight_files(index, shard, present):
        raise FileNotFoundError(
            f"{model_dir} lacks weight files rank {shard.rank} needs: {', '.join(missing)}"
        )


class Engine:
    """One loaded model and its tokenizer."""

    def __init__(
        self,
        model: Any,
        tokenizer: TokenizerWrapper,
        model_dir: Path,
        *,
        prefill_step: int = DEFAULT_PREFILL_STEP_TOKENS,
        share_tokens: SamplerWrap | None = None,
    ) -> None:
        self._model = model
        self._share_tokens = share_tokens
        self._tokenizer = tokenizer
        self._tool_format = ToolFormat.of(tokenizer)
        self._model_dir = model_dir
        self._prefill_step = prefill_step
        self.context_length = read_context_length(model_dir)
        """The model's context (prompt + output tokens), if its config states one."""

    @classmethod
    def load(
        cls,
        model_dir: Path,
        shard: ShardSpec = ShardSpec(),
        on_progress: ProgressCallback | None = None,
        *,
        prefill_step: int = DEFAULT_PREFILL_STEP_TOKENS,
        world: Any = None,
    ) -> Engine:
        """Load the mlx-lm model in local directory `model_dir`, reporting progress in [0, 1].

        Without `world` (an `mx.distributed.Group`) only a whole model (`shard.is_whole`) can
        be loaded; with it, only this rank's part (`trexo.engine.sharding.shard_model`), and
        every rank of `world` must then run the same generations in the same order.
        """
        if world is None and not shard.is_whole:
            raise ValueError(f"without a rank group only a whole model can be loaded, not {shard}")
        model_dir = Path(model_dir)
        # mlx-lm treats a path that does not exist as a Hugging Face repo id and downloads it.
        if not (model_dir / "config.json").is_file():
            raise FileNotFoundError(f"no model (config.json) in {model_dir}")
        # mlx-lm reads it with the standard library's parser, which recurses per level: a
        # hub's config nested deep is this load's clear error, not a RecursionError there.
        try:
            read_json_object(model_dir / "config.json")
        except BadJsonFile as exc:
            raise ValueError(f"{model_dir}: {exc}") from None
        progress = on_progress or _no_progress
        progress(0.0)
        share_tokens = None
        if world is None:
            model, config = load_model(model_dir)
        else:
            # A pipeline rank's directory may hold only the weight files its part needs (a
            # download fetches no others): say which are missing, else load what is there.
            # Lazily, so that the weights of the layers this rank drops are never read.
            _check_shard_files(model_dir, shard)
            model, config = load_model(model_dir, lazy=True, strict=shard.sharding == "tensor")
            share_tokens = shard_model(model, config, shard, world)
            mx.eval(model.parameters())
        progress(WEIGHTS_LOADED_PROGRESS)
        tokenizer = load_tokenizer(  # type: ignore[no-untyped-call]
            model_dir, eos_token_ids=config.get("eos_token_id")
        )
        progress(1.0)
        return cls(
            model, tokenizer, model_dir, prefill_step=prefill_step, share_tokens=share_tokens
        )

    @property
    def model(self) -> Any:
        return self._model

    @property
    def prefill_step(self) -> int:
        """Prompt tokens read per step."""
        return self._prefill_step

    @property
    def tokenizer(self) -> TokenizerWrapper:
        return self._tokenizer

    @property
    def model_dir(self) -> Path:
        return self._model_dir

    def warmup(self) -> None:
        """Generate a few tokens, so that the first real request does not pay for first use."""
        prompt = self._tokenizer.encode(WARMUP_PROMPT, add_special_tokens=False) or [0]
        for _ in stream_generate(
            self._model,
            self._tokenizer,
            mx.array(prompt),
            max_tokens=WARMUP_TOKENS,
            sampler=self._sampler(SamplingParams()),
        ):
            pass

    def _sampler(self, params: SamplingParams) -> Sampler:
        """`params`' sampler; on a rank of a split model, one that agrees with every rank."""
        sampler: Sampler = make_sampler(
            temp=params.temperature,
            top_p=params.top_p,
            min_p=params.min_p,
            top_k=params.top_k,
        )
        return sampler if self._share_tokens is None else self._share_tokens(sampler)

    def encode_prompt(self, request: GenerationRequest) -> list[int]:
        """The prompt's token ids (`trexo.engine.prompt.encode_prompt`)."""
        return encode_prompt(self._tokenizer, request)

    def admit(self, request: GenerationRequest) -> tuple[GenerationRequest, list[int]]:
        """The request as it will run (`max_tokens` capped to the context) and its prompt
        tokens, or `ValueError` saying why it cannot be served (no tokens to generate, an
        empty prompt, a prompt that fills the model's context)."""
        params = request.params
        if params.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, not {params.max_tokens}")
        if request.parses_tool_calls and self._tool_format is None:
            raise ValueError(
                "this model's chat template has no tool-call format trexo knows, "
                "so it cannot be offered tools"
            )
        if request.logprobs is not None and self._share_tokens is not None:
            raise ValueError("log probabilities are not available from a model split across nodes")
        prompt = self.encode_prompt(request)
        if not prompt:
            raise ValueError("the prompt encodes to no tokens")
        if self.context_length is not None:
            fitted = fitted_max_tokens(len(prompt), params.max_tokens, self.context_length)
            if fitted != params.max_tokens:
                request = attrs.evolve(request, params=attrs.evolve(params, max_tokens=fitted))
        return request, prompt

    def batch(
        self, *, max_batch: int = DEFAULT_MAX_BATCH, prompt_cache_bytes: int = 0
    ) -> BatchEngine:
        """A `BatchEngine` over this model: generations stepped together (at most
        `max_batch`, fewer for an architecture whose batched step is wrong in mlx-lm:
        `trexo.engine.batch_limits`)."""
        return BatchEngine(
            self._model,
            self._tokenizer,
            max_batch=batch_limit(self._model, max_batch),
            prefill_step=self._prefill_step,
            prompt_cache_bytes=prompt_cache_bytes,
            share_tokens=self._share_tokens,
        )

    def generate(
        self, request: GenerationRequest, should_stop: Callable[[], bool]
    ) -> Iterator[Chunk]:
        """Stream one request's output alone: one chunk per generated token, the last final.

        The final chunk has `finish_reason` and `usage`: "stop" (EOS or a stop sequence),
        "length" (`max_tokens` reached) or "cancelled" (`should_stop()` turned true; it is
        checked before every step, a decode step or a prefill chunk).

        Text is cut before a stop sequence, and text that might begin one is held back until it
        is known not to, so chunk texts never contain any part of a stop sequence occurrence.
        Chunk `token_ids` are the tokens generated at that step, whether or not their text has
        been released yet.

        `usage.completion_tokens` counts every token the model generated, including the EOS
        token that ended it and the tokens of a stop sequence, as mlx-lm's server and vLLM
        count (the model did produce them); it always equals the number of token ids over all
        chunks, whose last one is then the EOS. A cancelled generation counts what it delivered.

        The same `BatchEngine` a runner steps many requests with, holding just this one.
        Invalid requests raise `ValueError` here, before the first chunk is asked for.
        """
        request, prompt = self.admit(request)
        return self._alone(request, prompt, should_stop)

    def _alone(
        self, request: GenerationRequest, prompt: list[int], should_stop: Callable[[], bool]
    ) -> Iterator[Chunk]:
        rid = request.request_id
        if should_stop():
            yield Chunk(rid, "", finish_reason="cancelled", usage=Usage(len(prompt), 0))
            return
        batch = self.batch(max_batch=1)
        batch.add(request, prompt)
        while True:
            if should_stop():
                final = batch.remove(rid)
                assert final is not None
                yield final
                return
            for chunk in batch.step():
                yield chunk
                if chunk.finish_reason is not None:
                    return
