"""The Ollama API dialect: `/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`,
`/api/version`, as thin views over the one generation path (`trexo.api.streaming`).

Parsing is `trexo.api.ollama_request`, the bodies `trexo.api.ollama_response`. Every error
under `/api/` is `{"error": "..."}` with its HTTP status, as Ollama answers them. Ollama's
clients find these endpoints on the API port, or on a second listener at Ollama's own port
(`trexo run --ollama-port 11434`, `ApiConfig.ollama_port`).
"""

from __future__ import annotations

import logging
import time

from quart import Blueprint, Response

from trexo import __version__
from trexo.api.dialects import Dialect
from trexo.api.errors import SERVER_ERROR, ApiError
from trexo.api.handle import ModelListing, NodeHandle
from trexo.api.ollama_request import (
    LATEST_TAG,
    Endpoint,
    OllamaRequest,
    model_name,
    parse_chat,
    parse_generate,
    parse_show,
)
from trexo.api.ollama_response import (
    LineEncoder,
    Timings,
    answer_body,
    error_body,
    load_body,
    running_body,
    show_body,
    tag_body,
    timestamp,
    utc_now,
)
from trexo.api.outcome import outcome_of
from trexo.api.streaming import NDJSON, StreamSettings, collect_timed, open_stream
from trexo.api.views import (
    ErrorShape,
    admit_generation,
    json_response,
    read_json,
    stream_response,
)
from trexo.config import ApiConfig

log = logging.getLogger(__name__)

OLLAMA_PATH_PREFIX = "/api/"
OLLAMA_API_VERSION = "0.12.11"
"""What `/api/version` reports as `version`: the Ollama release whose API this dialect
follows (tools, `think`, JSON-schema `format`, `logprobs`, which came in 0.12.11). Clients
compare it with the release a feature needs; trexo's own version is `trexo_version`."""


def ollama_blueprint(node: NodeHandle, config: ApiConfig, settings: StreamSettings) -> Blueprint:
    blueprint = Blueprint("ollama", __name__)

    async def respond(endpoint: Endpoint, request: OllamaRequest, started_ns: int) -> Response:
        if request.ignored_options:
            log.debug(
                "ignoring options trexo does not have: %s", ", ".join(request.ignored_options)
            )
        model_id = _model_id(node, request.model)
        if request.generation is None:
            _require_ready(model_id, node.models())
            return json_response(
                load_body(endpoint, model=request.model, created_at=timestamp(utc_now()))
            )
        admitted = await admit_generation(
            node,
            model_id,
            request.generation,
            request.requested_max_tokens,
            config,
            schema_param="format",
        )
        logprobs = request.generation.logprobs is not None
        if not request.stream:
            # Timed as a stream is: clients divide the counts by the durations.
            collected = await collect_timed(node, model_id, admitted.generation)
            timings = Timings(started_ns, collected.first_token_ns, time.monotonic_ns())
            body = answer_body(
                endpoint,
                outcome_of(collected.chunks),
                model=request.model,
                created_at=timestamp(utc_now()),
                timings=timings,
                logprobs=logprobs,
            )
            return json_response(body)
        encoder = LineEncoder(endpoint, request.model, started_ns, logprobs=logprobs)
        lines = await open_stream(node, model_id, admitted.generation, encoder, NDJSON, settings)
        return stream_response(lines, NDJSON)

    @blueprint.post("/api/chat")
    async def chat() -> Response:
        started_ns = time.monotonic_ns()
        return await respond("chat", parse_chat(await read_json()), started_ns)

    @blueprint.post("/api/generate")
    async def generate() -> Response:
        started_ns = time.monotonic_ns()
        return await respond("generate", parse_generate(await read_json()), started_ns)

    @blueprint.get("/api/tags")
    async def tags() -> Response:
        return json_response({"models": [tag_body(listing) for listing in node.models()]})

    @blueprint.post("/api/show")
    async def show() -> Response:
        name = parse_show(await read_json())
        return json_response(show_body(_find(name, node.models())))

    @blueprint.get("/api/ps")
    async def running() -> Response:
        ready = [running_body(listing) for listing in node.models() if listing.ready]
        return json_response({"models": ready})

    @blueprint.get("/api/version")
    async def version() -> Response:
        return json_response({"version": OLLAMA_API_VERSION, "trexo_version": __version__})

    return blueprint


def _model_id(node: NodeHandle, name: str) -> str:
    """The model id `name` stands for. The node's models are listed only for a name with
    Ollama's `:latest` tag: listing them looks at the disk, too slow for every request."""
    if not name.endswith(LATEST_TAG):
        return name
    return model_name(name, [listing.model.model_id for listing in node.models()])


def _find(name: str, listings: list[ModelListing]) -> ModelListing:
    """The listing `name` names (Ollama's `:latest` tag allowed), or a 404 as Ollama's."""
    model_id = model_name(name, [listing.model.model_id for listing in listings])
    for listing in listings:
        if listing.model.model_id == model_id:
            return listing
    raise ApiError(404, f"model '{name}' not found", param="model", code="model_not_found")


def _require_ready(model_id: str, listings: list[ModelListing]) -> None:
    """A load request succeeds when the model can answer now: trexo loads a model when an
    instance of it is placed (`POST /instances`), not on a request."""
    if not _find(model_id, listings).ready:
        raise ApiError(
            503,
            f"model '{model_id}' is not ready: place an instance of it (POST /instances) and "
            "wait until it has loaded",
            type=SERVER_ERROR,
            code="model_unavailable",
        )


OLLAMA_ERRORS = ErrorShape((OLLAMA_PATH_PREFIX,), error_body)
OLLAMA = Dialect(ollama_blueprint, OLLAMA_ERRORS)
