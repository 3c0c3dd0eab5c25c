"""The OpenAI Responses dialect: `POST /v1/responses`, streamed as named SSE events or not.

trexo stores nothing: a response cannot be fetched or deleted by id afterwards (a 404 that
says so), and requests that point at stored state are refused (`trexo.api.responses_request`).
Errors take OpenAI's usual shape.
"""

from __future__ import annotations

import time

from quart import Blueprint, Response

from trexo.api.dialects import Dialect
from trexo.api.handle import NodeHandle
from trexo.api.responses_request import not_stored, parse_responses_request
from trexo.api.responses_response import ResponseEvents, response_from_chunks
from trexo.api.streaming import NAMED_SSE, StreamSettings
from trexo.api.views import admit_generation, answer, read_json
from trexo.config import ApiConfig

RESPONSES_PATH = "/v1/responses"


def responses_blueprint(node: NodeHandle, config: ApiConfig, settings: StreamSettings) -> Blueprint:
    blueprint = Blueprint("responses", __name__)

    @blueprint.post(RESPONSES_PATH)
    async def create_response() -> Response:
        parsed = parse_responses_request(await read_json())
        admitted = await admit_generation(
            node,
            parsed.model_id,
            parsed.generation,
            parsed.requested_max_tokens,
            config,
            schema_param="text.format.schema",
        )
        created_at = int(time.time())
        return await answer(
            node,
            parsed.model_id,
            admitted.generation,
            settings,
            stream=(ResponseEvents(parsed, created_at), NAMED_SSE) if parsed.stream else None,
            whole=lambda chunks: response_from_chunks(chunks, parsed, created_at),
        )

    @blueprint.route(f"{RESPONSES_PATH}/<response_id>", methods=["GET", "DELETE"])
    async def stored_response(response_id: str) -> Response:
        raise not_stored(response_id)

    return blueprint


RESPONSES = Dialect(responses_blueprint)
