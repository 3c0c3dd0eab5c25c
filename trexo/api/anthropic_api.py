"""The Anthropic Messages dialect: `POST /v1/messages` (streamed as Anthropic's named SSE
events, or not) and `POST /v1/messages/count_tokens`, with Anthropic's error shape for every
error under `/v1/messages`.

Headers Anthropic's clients send (`x-api-key`, `anthropic-version`, `anthropic-beta`) are
accepted and ignored: trexo has no keys, and serves one version of the API.
"""

from __future__ import annotations

import attrs
from quart import Blueprint, Response

from trexo.api.admission import admit
from trexo.api.anthropic_request import parse_count_tokens_request, parse_messages_request
from trexo.api.anthropic_response import MessageEvents, error_body, message_from_chunks
from trexo.api.dialects import Dialect
from trexo.api.errors import SERVER_ERROR, ApiError
from trexo.api.handle import NodeHandle
from trexo.api.streaming import NAMED_SSE, StreamSettings, collect, open_stream
from trexo.api.views import ErrorShape, json_response, read_json, stream_response
from trexo.config import ApiConfig
from trexo.types.generation import GenerationRequest

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = f"{MESSAGES_PATH}/count_tokens"


def anthropic_blueprint(node: NodeHandle, config: ApiConfig, settings: StreamSettings) -> Blueprint:
    blueprint = Blueprint("anthropic", __name__)

    @blueprint.post(MESSAGES_PATH)
    async def create_message() -> Response:
        parsed = parse_messages_request(await read_json())
        generation, input_tokens = await _admit_counted(
            node, parsed.model_id, parsed.generation, parsed.requested_max_tokens, config
        )
        if parsed.stream:
            events = MessageEvents(parsed.message_id, parsed.model_id, input_tokens or 0)
            body = await open_stream(node, parsed.model_id, generation, events, NAMED_SSE, settings)
            return stream_response(body, NAMED_SSE)
        chunks = await collect(node, parsed.model_id, generation)
        return json_response(
            message_from_chunks(chunks, message_id=parsed.message_id, model=parsed.model_id)
        )

    @blueprint.post(COUNT_TOKENS_PATH)
    async def count_tokens() -> Response:
        parsed = parse_count_tokens_request(await read_json())
        budget = await node.prompt_budget(parsed.model_id, parsed.generation)
        if budget is None:
            # Not a transient state a retry here would end: no Retry-After.
            raise ApiError(
                503,
                f"This node cannot count tokens for '{parsed.model_id}': the model's "
                "tokenizer is not on this node. Ask a node that has the model's files.",
                type=SERVER_ERROR,
                code="tokenizer_unavailable",
            )
        return json_response({"input_tokens": budget.prompt_tokens})

    return blueprint


async def _admit_counted(
    node: NodeHandle,
    model_id: str,
    generation: GenerationRequest,
    requested_max_tokens: int,
    config: ApiConfig,
) -> tuple[GenerationRequest, int | None]:
    """`generation` admitted against its model's context (as `views.admit_generation`
    does), and its prompt tokens as counted here, for `message_start` (None: not counted
    here; the runner counts and checks)."""
    budget = await node.prompt_budget(model_id, generation)
    if budget is None:
        return generation, None
    admitted = admit(
        generation, budget, requested_max_tokens=requested_max_tokens, cap=config.max_context_tokens
    )
    return attrs.evolve(generation, params=admitted.params), budget.prompt_tokens


ANTHROPIC = Dialect(anthropic_blueprint, ErrorShape((MESSAGES_PATH,), error_body))
