"""The HTTP API: an OpenAI-compatible Quart-trio app over a `NodeHandle`.

Every error, Quart's own (404, 405, 413, ...) included, is answered with an OpenAI-style
JSON body (`trexo.api.errors`); no HTML error page is ever sent.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import attrs
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import (
    HTTPException,
    MethodNotAllowed,
    RequestEntityTooLarge,
    RequestTimeout,
)

from trexo.api import anthropic_models
from trexo.api.auth import register_auth
from trexo.api.chat_request import parse_chat_request
from trexo.api.chat_response import ChunkEncoder, completion_from_chunks
from trexo.api.cors import CorsPolicy, register_cors
from trexo.api.cross_site import register_cross_site
from trexo.api.dashboard import register_dashboard
from trexo.api.dialects import dialects
from trexo.api.errors import ApiError, find_api_error, internal_error
from trexo.api.exchange import ExchangeHTTPConnection
from trexo.api.handle import ModelListing, NodeHandle
from trexo.api.idempotent import request_idempotency_key, retry_under
from trexo.api.instance_request import parse_place_instance
from trexo.api.sse import SSE_CONTENT_TYPE, SSE_HEADERS
from trexo.api.state_events import StateEvents
from trexo.api.streaming import OPENAI_SSE, StreamSettings
from trexo.api.text_completion import (
    CompletionEvents,
    parse_completion_request,
)
from trexo.api.text_completion import completion_body as text_completion_body
from trexo.api.unsupported import register_unsupported
from trexo.api.validation import invalid_value, missing
from trexo.api.views import (
    ErrorShape,
    admit_generation,
    answer,
    error_body_for,
    json_response,
    read_json,
)
from trexo.config import ApiConfig
from trexo.errors import ModelNotFound
from trexo.hub.curated import curated
from trexo.idempotency import IDEMPOTENCY_HEADER
from trexo.master.previews import PlacementPreview, previews
from trexo.types.ids import InstanceId, RequestId
from trexo.types.state import Instance, State
from trexo.wire import converter

logger = logging.getLogger(__name__)

OWNED_BY = "trexo"


def create_app(node: NodeHandle, config: ApiConfig) -> QuartTrio:
    """The API app for `node`; serve it with `trexo.api.server.ApiServer`."""
    app = QuartTrio("trexo.api")
    # Each exchange's nursery is handed to its view: streams run their generation in it.
    app.asgi_http_class = ExchangeHTTPConnection
    app.config.update(
        RESPONSE_TIMEOUT=None,  # Quart's 60 s default would cut long generations
        BODY_TIMEOUT=config.body_timeout,
        MAX_CONTENT_LENGTH=config.max_body_bytes,
        PROPAGATE_EXCEPTIONS=False,  # never a traceback page, even in debug mode
    )

    # Each dialect answers errors under its paths in its own shape (OpenAI's elsewhere).
    error_shapes: list[ErrorShape] = []

    def error_response(error: ApiError) -> Response:
        # Iterating Headers gives (name, value) pairs: keys() gives the names.
        names = frozenset(name.lower() for name in request.headers.keys())  # noqa: SIM118
        body = error_body_for(request.path, error, error_shapes, names)
        return json_response(body, error.status, error.headers())

    @app.before_request
    async def read_body() -> None:
        # Hypercorn wedges a kept-alive connection whose response went out before all of
        # its request body was read, so every body is read (within MAX_CONTENT_LENGTH and
        # BODY_TIMEOUT) before any answer, a 404 included; views then get it from the cache.
        await request.get_data(cache=True, as_text=False, parse_form_data=False)

    # After `read_body`, so that a refused request's body has been read too; web pages
    # are refused before keys are looked at.
    register_cross_site(app, config, error_response)
    register_auth(app, config.api_keys, error_response)

    @app.errorhandler(Exception)
    async def on_error(error: Exception) -> Response:
        if isinstance(error, HTTPException):
            response = error_response(http_error_to_api(error, config))
            if isinstance(error, MethodNotAllowed) and error.valid_methods:
                response.headers["Allow"] = ", ".join(error.valid_methods)
            if isinstance(error, RequestEntityTooLarge | RequestTimeout):
                # The rest of the body is still on its way and will not be read, so the
                # connection cannot carry another request (see `read_body`).
                response.headers["Connection"] = "close"
            return response
        api_error = find_api_error(error)
        if api_error is None:
            logger.error("%s %s failed", request.method, request.path, exc_info=error)
            api_error = internal_error()
        return error_response(api_error)

    settings = StreamSettings(config.keepalive_interval, config.stalled_client_timeout)

    @app.post("/v1/chat/completions")
    async def chat_completions() -> Response:
        chat = parse_chat_request(await read_json())
        admitted = await admit_generation(
            node, chat.model_id, chat.generation, chat.requested_max_tokens, config
        )
        now = int(time.time())
        logprobs = chat.generation.logprobs is not None
        encoder = ChunkEncoder(
            request_id=chat.request_id,
            model=chat.model_id,
            created=now,
            include_usage=chat.include_usage,
            logprobs=logprobs,
        )
        return await answer(
            node,
            chat.model_id,
            admitted.generation,
            settings,
            stream=(encoder, OPENAI_SSE) if chat.stream else None,
            whole=lambda chunks: completion_from_chunks(
                chunks,
                request_id=chat.request_id,
                model=chat.model_id,
                created=now,
                logprobs=logprobs,
            ),
        )

    @app.post("/v1/completions")
    async def text_completions() -> Response:
        completion = parse_completion_request(await read_json())
        admitted = await admit_generation(
            node,
            completion.model_id,
            completion.generation,
            completion.requested_max_tokens,
            config,
        )
        completion = attrs.evolve(completion, generation=admitted.generation)
        now = int(time.time())
        return await answer(
            node,
            completion.model_id,
            completion.generation,
            settings,
            stream=(CompletionEvents(completion, now), OPENAI_SSE) if completion.stream else None,
            whole=lambda chunks: text_completion_body(chunks, request=completion, created=now),
        )

    @app.get("/v1/models")
    async def list_models() -> Response:
        if anthropic_models.VERSION_HEADER in request.headers:  # Anthropic's clients
            models = [listing.model for listing in node.models()]
            return json_response(anthropic_models.models_page(models, request.args))
        data = [model_object(listing) for listing in node.models()]
        return json_response({"object": "list", "data": data})

    @app.get("/v1/models/<path:model_id>")
    async def get_model(model_id: str) -> Response:
        for listing in node.models():
            if listing.model.model_id == model_id:
                if anthropic_models.VERSION_HEADER in request.headers:
                    return json_response(anthropic_models.model_body(listing.model))
                return json_response(model_object(listing))
        raise ApiError(
            404,
            f"The model '{model_id}' does not exist.",
            param="model",
            code="model_not_found",
        )

    @app.get("/state")
    async def get_state() -> Response:
        return json_response(converter.unstructure(node.current_state(), State))

    @app.get("/health")
    async def get_health() -> Response:
        return json_response(node.health())

    state_events = StateEvents(node, config)

    @app.get("/state/events")
    async def follow_state() -> Response:
        return app.response_class(
            state_events.open(), status=200, headers=SSE_HEADERS, content_type=SSE_CONTENT_TYPE
        )

    @app.get("/instances")
    async def list_instances() -> Response:
        instances = node.current_state().instances.values()
        data = [converter.unstructure(instance, Instance) for instance in instances]
        return json_response({"object": "list", "data": data})

    @app.post("/instances")
    async def place_instance() -> Response:
        place = parse_place_instance(await read_json())
        key = request_idempotency_key()
        with retry_under(key):
            instance_id = await node.place_instance(
                place.model_id,
                place.node_ids,
                sharding=place.sharding,
                node_count=place.node_count,
                idempotency_key=key,
            )
        return json_response({"instance_id": instance_id}, 201, {IDEMPOTENCY_HEADER: key})

    @app.get("/instances/previews")
    async def instance_previews() -> Response:
        try:
            model = await node.resolve_model(preview_model_id(request.args.get("model")))
        except ModelNotFound as exc:  # the query parameter names no model
            raise ApiError(404, str(exc), param="model", code="model_not_found") from None
        data = [
            converter.unstructure(p, PlacementPreview)
            for p in previews(node.current_state(), model)
        ]
        return json_response({"model": model.model_id, "previews": data})

    @app.delete("/instances/<instance_id>")
    async def delete_instance(instance_id: str) -> Response:
        key = request_idempotency_key()
        with retry_under(key):
            await node.delete_instance(InstanceId(instance_id), idempotency_key=key)
        body = {"instance_id": instance_id, "deleted": True}
        return json_response(body, headers={IDEMPOTENCY_HEADER: key})

    @app.post("/v1/cancel/<request_id>")
    async def cancel(request_id: str) -> Response:
        if not await node.cancel(RequestId(request_id)):
            raise ApiError(
                404,
                f"No generation with id '{request_id}' is in flight.",
                param="request_id",
                code="request_not_found",
            )
        return json_response({"request_id": request_id, "cancelled": True})

    register_dashboard(app)
    register_unsupported(app)
    for dialect in dialects():
        app.register_blueprint(dialect.blueprint(node, config, settings))
        if dialect.errors is not None:
            error_shapes.append(dialect.errors)

    # After `read_body`: an OPTIONS request's body, if any, is read before it is answered.
    register_cors(app, CorsPolicy(config.cors_origins, config.cors_max_age))
    return app


def preview_model_id(raw: str | None) -> str:
    """The `model` query parameter of `GET /instances/previews`, or a 400."""
    if raw is None:
        raise missing("model")
    if not raw:
        raise invalid_value("model", "expected a non-empty string")
    return raw


def model_object(listing: ModelListing) -> dict[str, Any]:
    """A `/v1/models` entry. trexo's extensions: `placed` (an instance exists, maybe still
    loading), `ready` (one can serve now; `loaded` is the same, under exo's name),
    `downloaded` (this node has every file), `size_bytes` and `n_layers` (when known; sizes
    of the curated models are approximate until resolved), `parameters` and `quantization`
    (curated models)."""
    model = listing.model
    entry: dict[str, Any] = {
        "id": model.model_id,
        "object": "model",
        "created": model.created,
        "owned_by": OWNED_BY,
        "placed": listing.placed,
        "ready": listing.ready,
        "loaded": listing.ready,
        "downloaded": listing.downloaded,
        "size_bytes": model.size_bytes,
    }
    curated_entry = curated(model.model_id)
    if model.layout is not None:
        entry["n_layers"] = model.layout.n_layers
    elif curated_entry is not None:
        entry["n_layers"] = curated_entry.n_layers
    if curated_entry is not None:
        entry["parameters"] = curated_entry.parameters
        entry["quantization"] = curated_entry.quantization
    return entry


def http_error_to_api(error: HTTPException, config: ApiConfig) -> ApiError:
    """Quart's and werkzeug's HTTP errors (unknown URL, wrong method, ...) as OpenAI's."""
    status = error.code or 500
    match status:
        case 404:
            message = f"Invalid URL ({request.method} {request.path})"
            code = "unknown_url"
        case 405:
            message = f"Method {request.method} is not allowed for {request.path}"
            code = "method_not_allowed"
        case 413:
            message = f"The request body is larger than the limit of {config.max_body_bytes} bytes"
            code = "request_too_large"
        case 408:
            message = f"The request body did not arrive within {config.body_timeout:g} s"
            code = "request_timeout"
        case _:
            message = error.description or error.name
            code = error.name.lower().replace(" ", "_")
    return ApiError(
        status,
        message,
        type="server_error" if status >= 500 else "invalid_request_error",
        code=code,
    )
