"""`admit`: prompt + max_tokens against the tighter of the model's context and the cap."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trexo.api.admission import PromptBudget, admit, context_limit
from trexo.api.errors import ApiError
from trexo.types.generation import DEFAULT_MAX_TOKENS, GenerationRequest
from trexo.types.ids import RequestId

REQUEST = GenerationRequest(RequestId("r"), prompt="x")


@given(
    prompt=st.integers(0, 10_000),
    context=st.none() | st.integers(1, 10_000),
    cap=st.none() | st.integers(1, 10_000),
    requested=st.none() | st.integers(1, 10_000),
)
def test_admitted_requests_fit_and_only_a_prompt_with_no_room_is_refused(
    prompt: int, context: int | None, cap: int | None, requested: int | None
) -> None:
    budget = PromptBudget(prompt, context)
    limit = context_limit(budget, cap)
    if limit is not None and prompt >= limit:
        with pytest.raises(ApiError) as refused:
            admit(REQUEST, budget, requested_max_tokens=requested, cap=cap)
        error = refused.value
        assert (error.status, error.code, error.param) == (
            400,
            "context_length_exceeded",
            "messages",
        )
        assert str(limit) in error.message and str(prompt) in error.message
        return
    max_tokens = admit(REQUEST, budget, requested_max_tokens=requested, cap=cap).params.max_tokens
    if limit is None:
        assert max_tokens == (requested or DEFAULT_MAX_TOKENS)
    else:
        room = limit - prompt
        # Capped to the room, never refused: absent, all of it.
        assert max_tokens == (min(requested, room) if requested else room)


def test_the_cap_is_a_limit_below_the_models_context() -> None:
    budget = PromptBudget(100, 4096)
    assert admit(REQUEST, budget, requested_max_tokens=413, cap=512).params.max_tokens == 412
    assert admit(REQUEST, budget, requested_max_tokens=None, cap=512).params.max_tokens == 412
    with pytest.raises(ApiError, match="maximum context length is 512 tokens"):
        admit(REQUEST, PromptBudget(512, 4096), requested_max_tokens=1, cap=512)
