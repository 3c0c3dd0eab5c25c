"""Load a model with mlx-lm and stream generations from it, synchronously.

An `Engine` is driven from one dedicated compute thread (MLX streams are per thread) and knows
nothing of trio: the runner feeds it requests and passes a `should_stop` callable that reads
the flag its trio side sets. One generation at a time: seeding and the KV cache are per engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.generate import stream_generate
from mlx_lm.sample_utils import make_logits_processors, make_sampler
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_model, load_tokenizer

from trexo.engine.stops import StopMatcher
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


class Engine:
    """One loaded model and its tokenizer."""

    def __init__(self, model: Any, tokenizer: TokenizerWrapper, model_dir: Path) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self._model_dir = model_dir

    @classmethod
    def load(
        cls,
        model_dir: Path,
        shard: ShardSpec = ShardSpec(),
        on_progress: ProgressCallback | None = None,
    ) -> Engine:
        """Load the mlx-lm model in local directory `model_dir`, reporting progress in [0, 1].

        Only a whole model (`shard.is_whole`) can be loaded for now.
        """
        if not shard.is_whole:
            raise ValueError(f"only whole-model shards can be loaded for now, not {shard}")
        model_dir = Path(model_dir)
        # mlx-lm treats a path that does not exist as a Hugging Face repo id and downloads it.
        if not (model_dir / "config.json").is_file():
            raise FileNotFoundError(f"no model (config.json) in {model_dir}")
        progress = on_progress or _no_progress
        progress(0.0)
        model, config = load_model(model_dir)
        progress(WEIGHTS_LOADED_PROGRESS)
        tokenizer = load_tokenizer(  # type: ignore[no-untyped-call]
            model_dir, eos_token_ids=config.get("eos_token_id")
        )
        progress(1.0)
        return cls(model, tokenizer, model_dir)

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
            self._model, self._tokenizer, mx.array(prompt), max_tokens=WARMUP_TOKENS
        ):
            pass

    def encode_prompt(self, request: GenerationRequest) -> list[int]:
        """The prompt's token ids: the chat template applied to `messages`, or `prompt`."""
        if request.messages is not None:
            messages = [{"role": m.role, "content": m.content} for m in request.messages]
            tokens = self._tokenizer.apply_chat_template(  # type: ignore[no-untyped-call]
                messages, add_generation_prompt=True
            )
            return list(tokens)
        assert request.prompt is not None
        # As mlx-lm does for text prompts: add BOS unless the prompt already starts with it.
        bos = self._tokenizer.bos_token
        add_special = bos is None or not request.prompt.startswith(bos)
        return list(self._tokenizer.encode(request.prompt, add_special_tokens=add_special))

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
            sampler=make_sampler(
                temp=params.temperature,
                top_p=params.top_p,
                min_p=params.min_p,
                top_k=params.top_k,
            ),
            logits_processors=make_logits_processors(repetition_penalty=params.repetition_penalty),
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
        finally:
            # Closing stream_generate ends its generator steps and waits for pending compute.
            responses.close()
        raise RuntimeError("mlx-lm's stream_generate ended without a finish reason")
