"""The Anthropic Messages dialect: `POST /v1/messages` (streamed as Anthropic's named SSE
events, or not) and `POST /v1/messages/count_tokens`, with Anthropic's error shape for every
error under `/v1/messages`.

`x-api-key` is checked like any API key when the node has keys (`trexo.api.auth`), else
ignored; `anthropic-version` and `anthropic-beta` are accepted and ignored: trexo serves one
version of the API.
"""

from __future__ import annotations

from quart import Blueprint, Response

from trexo.api import anthropic_models
from trexo.api.anthropic_request import parse_count_tokens_request, parse_messages_request
from trexo.api.anthropic_response import MessageEvents, error_body, message_from_chunks
from trexo.api.dialects import Dialect
from trexo.api.errors import SERVER_ERROR, ApiError
from trexo.api.handle import NodeHandle
from trexo.api.streaming import NAMED_SSE, StreamSettings
from trexo.api.views import ErrorShape, admit_generation, answer, json_response, read_json
from trexo.config import ApiConfig

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = f"{MESSAGES_PATH}/count_tokens"


def anthropic_blueprint(node: NodeHandle, config: ApiConfig, settings: StreamSettings) -> Blueprint:
    blueprint = Blueprint("anthropic", __name__)

    @blueprint.post(MESSAGES_PATH)
    async def create_message() -> Response:
        parsed = parse_messages_request(await read_json())
        admitted = await admit_generation(
            node,
            parsed.model_id,
            parsed.generation,
            parsed.requested_max_tokens,
            config,
            schema_param="output_config.format.schema",
        )
        # `message_start` carries the prompt count made here (0: the runner counts it).
        events = MessageEvents(
            parsed.message_id,
            parsed.model_id,
            admitted.prompt_tokens or 0,
            show_thinking=parsed.show_thinking,
        )
        return await answer(
            node,
            parsed.model_id,
            admitted.generation,
            settings,
            stream=(events, NAMED_SSE) if parsed.stream else None,
            whole=lambda chunks: message_from_chunks(
                chunks,
                message_id=parsed.message_id,
                model=parsed.model_id,
                show_thinking=parsed.show_thinking,
            ),
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


ANTHROPIC = Dialect(
    anthropic_blueprint,
    ErrorShape(
        (MESSAGES_PATH,),
        error_body,
        shared_paths=(anthropic_models.MODELS_PATH,),
        header=anthropic_models.VERSION_HEADER,
    ),
)
