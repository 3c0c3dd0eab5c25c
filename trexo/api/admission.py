"""Admission: a request's prompt plus its output must fit the model's context. Pure.

Checked in the API before anything reaches the master, so a prompt that can never be served
is a fast 400 instead of minutes of prefill holding the only runner. A `max_tokens` past what
the context leaves after the prompt is capped to it, and an absent one becomes it.
"""

from __future__ import annotations

import attrs

from trexo.api.errors import ApiError
from trexo.types.generation import DEFAULT_MAX_TOKENS, GenerationRequest

CONTEXT_EXCEEDED = "context_length_exceeded"
"""OpenAI's error code for a request that does not fit the context."""


@attrs.frozen
class PromptBudget:
    """What the node knows of a request's size against its model."""

    prompt_tokens: int
    context: int | None
    """The model's context (prompt + output tokens), if its config states one."""


def context_limit(budget: PromptBudget, cap: int | None) -> int | None:
    """The tighter of the model's context and the node's configured cap (None: no limit)."""
    limits = [n for n in (budget.context, cap) if n is not None]
    return min(limits) if limits else None


def admit(
    request: GenerationRequest,
    budget: PromptBudget,
    *,
    requested_max_tokens: int | None,
    cap: int | None = None,
) -> GenerationRequest:
    """`request` with its `max_tokens` settled, or a 400 naming the numbers that do not fit."""
    limit = context_limit(budget, cap)
    if limit is None:
        max_tokens = requested_max_tokens or DEFAULT_MAX_TOKENS
    else:
        room = limit - budget.prompt_tokens
        if room < 1:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your "
                f"messages resulted in {budget.prompt_tokens} tokens, which leaves no room "
                "for a completion. Please reduce the length of the messages.",
                param="messages",
                code=CONTEXT_EXCEEDED,
            )
        # A limit past the room is capped, not refused: clients size it for large models
        # (Anthropic's and Ollama's always send one). What fits is generated, and the
        # answer ends with "length", as mlx_lm.server, llama.cpp and Ollama do.
        max_tokens = min(requested_max_tokens, room) if requested_max_tokens else room
    params = attrs.evolve(request.params, max_tokens=max_tokens)
    return attrs.evolve(request, params=params)
