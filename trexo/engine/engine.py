"""Load a model with mlx-lm and stream generations from it, synchronously.

An `Engine` is driven from one dedicated compute thread (MLX streams are per thread) and knows
nothing of trio: the runner feeds it requests and passes a `should_stop` callable that reads
the flag its trio side sets. One generation at a time: seeding and the KV cache are per engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.generate import stream_generate
from mlx_lm.sample_utils import make_logits_processors, make_sampler
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_model, load_tokenizer

from trexo.config import DEFAULT_PREFILL_STEP_TOKENS
from trexo.engine.prompt import encode_prompt, read_context_length
from trexo.engine.sharding import Sampler, SamplerWrap, shard_model
from trexo.engine.stops import StopMatcher
from trexo.hub.files import WEIGHT_INDEX, missing_weight_files
from trexo.types.chunks import Chunk, FinishReason, Usage
from trexo.types.generation import GenerationRequest, SamplingParams
from trexo.types.ids import RequestId
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


def check_fits(prompt_tokens: int, max_tokens: int, context: int) -> None:
    """`ValueError` naming the numbers unless the prompt plus `max_tokens` fit `context`."""
    if prompt_tokens + max_tokens > context:
        raise ValueError(
            f"the prompt has {prompt_tokens} tokens and max_tokens is {max_tokens}: "
            f"{prompt_tokens + max_tokens} tokens do not fit the model's context of {context}"
        )


def _check_shard_files(model_dir: Path, shard: ShardSpec) -> None:
    """`FileNotFoundError` naming the weight files `shard` needs that `model_dir` lacks."""
    index_path = model_dir / WEIGHT_INDEX
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        index = None
    except ValueError as exc:
        raise ValueError(f"{index_path} is not JSON: {exc}") from exc
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

    def generate(
        self, request: GenerationRequest, should_stop: Callable[[], bool]
    ) -> Iterator[Chunk]:
        """Stream the request's output: one chunk per generated token, the last one final.

        The final chunk has `finish_reason` and `usage`: "stop" (EOS or a stop sequence),
        "length" (`max_tokens` reached) or "cancelled" (`should_stop()` turned true; it is
        checked before every decode step, so at most the one token mlx-lm already computes
        ahead is computed and discarded).

        Text is cut before a stop sequence, and text that might begin one is held back until it
        is known not to, so chunk texts never contain any part of a stop sequence occurrence.
        Chunk `token_ids` are the tokens generated at that step, whether or not their text has
        been released yet.

        `usage.completion_tokens` counts every token the model generated, including the EOS
        token that ended it and the tokens of a stop sequence, as mlx-lm's server and vLLM
        count (the model did produce them); it always equals the number of token ids over all
        chunks, whose last one is then the EOS. A cancelled generation counts what it delivered.

        Invalid requests raise `ValueError` here, before the first chunk is asked for.
        """
        params = request.params
        if params.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, not {params.max_tokens}")
        prompt = self.encode_prompt(request)
        if not prompt:
            raise ValueError("the prompt encodes to no tokens")
        if self.context_length is not None:
            check_fits(len(prompt), params.max_tokens, self.context_length)
        return self._stream(request.request_id, prompt, params, should_stop)

    def _stream(
        self,
        request_id: RequestId,
        prompt: Sequence[int],
        params: SamplingParams,
        should_stop: Callable[[], bool],
    ) -> Iterator[Chunk]:
        def final(text: str, token_ids: tuple[int, ...], reason: FinishReason) -> Chunk:
            usage = Usage(prompt_tokens=len(prompt), completion_tokens=generated)
            return Chunk(request_id, text, token_ids, finish_reason=reason, usage=usage)

        generated = 0
        if should_stop():
            yield final("", (), "cancelled")
            return

        def between_prefill_chunks(done: int, total: int) -> None:
            # mlx-lm prefills in chunks of `prefill_step_size` and calls this after each:
            # the one place a long prompt's prefill can be interrupted.
            if done < total and should_stop():
                raise _PrefillCancelled

        if params.seed is not None:
            mx.random.seed(params.seed)
        matcher = StopMatcher(params.stop)
        # Our own detokenizer, not the response's text, so that a cancelled generation can
        # flush what the detokenizer holds back (a trailing space, an unfinished character).
        detokenizer = self._tokenizer.detokenizer
        responses = stream_generate(
            self._model,
            self._tokenizer,
            mx.array(list(prompt)),
            max_tokens=params.max_tokens,
            sampler=self._sampler(params),
            logits_processors=make_logits_processors(repetition_penalty=params.repetition_penalty),
            prefill_step_size=self._prefill_step,
            prompt_progress_callback=between_prefill_chunks,
        )
        try:
            for response in responses:
                generated = response.generation_tokens
                token_ids = (int(response.token),)
                # On "stop" the response's token is the EOS, which carries no text.
                if response.finish_reason != "stop":
                    detokenizer.add_token(response.token)
                if response.finish_reason is not None:
                    detokenizer.finalize()
                released = matcher.feed(detokenizer.last_segment)
                if released.stopped:
                    yield final(released.text, token_ids, "stop")
                    return
                if response.finish_reason is not None:
                    reason: FinishReason = "stop" if response.finish_reason == "stop" else "length"
                    yield final(released.text + matcher.flush(), token_ids, reason)
                    return
                yield Chunk(request_id, released.text, token_ids)
                if should_stop():
                    detokenizer.finalize()
                    tail = matcher.feed(detokenizer.last_segment)
                    text = tail.text if tail.stopped else tail.text + matcher.flush()
                    yield final(text, (), "cancelled")
                    return
        except _PrefillCancelled:
            yield final("", (), "cancelled")
            return
        finally:
            # Closing stream_generate ends its generator steps and waits for pending compute.
            responses.close()
        raise RuntimeError("mlx-lm's stream_generate ended without a finish reason")
