"""What a generation asks for: chat messages or a prompt, and how to sample."""

from __future__ import annotations

import attrs

from trexo.types.ids import RequestId

DEFAULT_MAX_TOKENS = 256


@attrs.frozen
class ChatMessage:
    role: str
    content: str


@attrs.frozen
class SamplingParams:
    """Sampling knobs, as mlx-lm's `make_sampler` / `make_logits_processors` take them.

    `temperature == 0` is greedy decoding. Zero for `top_p`, `top_k`, `min_p` means "off".
    """

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    top_p: float = 0.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float | None = None
    stop: tuple[str, ...] = ()


@attrs.frozen
class GenerationRequest:
    """One generation. Exactly one of `messages` (chat template applied) or `prompt` is set."""

    request_id: RequestId
    messages: tuple[ChatMessage, ...] | None = None
    prompt: str | None = None
    params: SamplingParams = SamplingParams()

    def __attrs_post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("a generation request needs exactly one of messages or prompt")
