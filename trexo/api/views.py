"""What every dialect's views share: reading the JSON body, admitting a generation against its
model's context, and answering with JSON or a stream. Runs inside a Quart request."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Container, Mapping, Sequence
from typing import Any

import attrs
from quart import Response, current_app, request

from trexo import safe_json
from trexo.api.admission import admit
from trexo.api.cross_site import json_body_refusal
from trexo.api.errors import ApiError
from trexo.api.handle import NodeHandle
from trexo.api.sse import SSE_HEADERS, dumps
from trexo.api.streaming import ChunkEvents, Framing, StreamSettings, collect, open_stream
from trexo.api.validation import invalid_value
from trexo.config import ApiConfig
from trexo.types.chunks import Chunk
from trexo.types.generation import GenerationRequest

JSON_CONTENT_TYPE = "application/json"

ErrorBody = Callable[[ApiError], dict[str, Any]]


@attrs.frozen
class ErrorShape:
    """A dialect's error body, for every error under its paths (an unknown URL included)."""

    path_prefixes: tuple[str, ...]
    body: ErrorBody
    shared_paths: tuple[str, ...] = ()
    """Paths dialects share (`/v1/models`), claimed when a request carries `header`."""
    header: str | None = None


def error_body_for(
    path: str, error: ApiError, shapes: Sequence[ErrorShape], header_names: Container[str]
) -> dict[str, Any]:
    """`error`'s body in the dialect of `path` (OpenAI's where no dialect claims the path);
    `header_names` are the request's, lower-cased."""
    for shape in shapes:
        if path.startswith(shape.path_prefixes):
            return shape.body(error)
        claimed = shape.header is not None and shape.header in header_names
        if claimed and path.startswith(shape.shared_paths):
            return shape.body(error)
    return error.body()


def json_response(
    body: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return current_app.response_class(
        dumps(body), status=status, headers=dict(headers or {}), content_type=JSON_CONTENT_TYPE
    )


def stream_response(body: AsyncIterator[bytes], framing: Framing) -> Response:
    return current_app.response_class(
        body, status=200, headers=SSE_HEADERS, content_type=framing.content_type
    )


async def read_json() -> Any:
    """The request body as JSON; a 400 if it is not JSON, or is hostile JSON (NaN, Infinity,
    nesting past `MAX_JSON_DEPTH`, out-of-range numbers: see `trexo.safe_json`). Whatever
    its content type, except from a browser: a 415 unless declared JSON (see
    `trexo.api.cross_site`)."""
    refusal = json_body_refusal(request.headers)
    if refusal is not None:
        raise refusal
    data = await request.get_data(cache=True, as_text=False, parse_form_data=False)
    try:
        # Lone surrogates pass here: the request's validation refuses them, naming the field.
        return safe_json.loads(data, allow_lone_surrogates=True)
    except safe_json.InvalidJson as exc:
        raise ApiError(
            400,
            f"We could not parse the JSON body of your request: {exc.detail}",
            code="invalid_json",
        ) from None


@attrs.frozen
class Admitted:
    generation: GenerationRequest
    """With `max_tokens` settled against the model's context."""
    prompt_tokens: int | None
    """As counted on this node; None: this node has no tokenizer for it (its runner checks)."""


async def admit_generation(
    node: NodeHandle,
    model_id: str,
    generation: GenerationRequest,
    requested_max_tokens: int | None,
    config: ApiConfig,
    *,
    schema_param: str = "response_format.json_schema.schema",
) -> Admitted:
    """`generation` admitted against its model's context, or a 400 (`trexo.api.admission`).
    `requested_max_tokens`: what the client asked for, if anything. A JSON schema it must
    follow is checked first (a 400 naming `schema_param`, where the dialect carries it)."""
    fmt = generation.response_format
    if fmt is not None and fmt.schema is not None:
        try:
            await node.check_schema(fmt.schema)
        except ValueError as exc:
            raise invalid_value(schema_param, str(exc).rstrip(".")) from None
    budget = await node.prompt_budget(model_id, generation)
    if budget is None:
        return Admitted(generation, None)
    admitted = admit(
        generation,
        budget,
        requested_max_tokens=requested_max_tokens,
        cap=config.max_context_tokens,
    )
    return Admitted(attrs.evolve(generation, params=admitted.params), budget.prompt_tokens)


async def answer(
    node: NodeHandle,
    model_id: str,
    generation: GenerationRequest,
    settings: StreamSettings,
    *,
    stream: tuple[ChunkEvents, Framing] | None,
    whole: Callable[[list[Chunk]], Any],
) -> Response:
    """The response to a generation: streamed as `stream`'s events in its framing, or, once
    it has finished, the JSON body `whole` makes of its chunks."""
    if stream is not None:
        events, framing = stream
        body = await open_stream(node, model_id, generation, events, framing, settings)
        return stream_response(body, framing)
    return json_response(whole(await collect(node, model_id, generation)))
