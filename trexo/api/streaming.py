"""The one path of every dialect: run a generation through the node, collected into one
response or streamed, and write the stream in the dialect's framing.

A dialect supplies a `ChunkEvents` (what JSON events its stream has for each chunk, and for
an error) and a `Framing` (SSE `data:` lines ending in `[DONE]`, SSE named events, NDJSON);
cancellation, disconnects, stalled clients, keep-alives and errors are handled here once.

A client that disconnects cancels its generation: quart-trio cancels the exchange nursery
(`trexo.api.exchange`) on `http.disconnect`; the task iterating the node's chunks gets
`trio.Cancelled` and leaves `node.open_generation(...)`, which cancels the generation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, TypeVar

import attrs
import trio

from trexo.api.errors import ApiError, find_api_error, internal_error
from trexo.api.exchange import exchange_nursery
from trexo.api.handle import NodeHandle
from trexo.api.sse import DONE, KEEPALIVE, SSE_CONTENT_TYPE, dumps, sse_event
from trexo.errors import GenerationFailed
from trexo.types.chunks import Chunk
from trexo.types.generation import GenerationRequest

logger = logging.getLogger(__name__)

T = TypeVar("T")

StreamItem = Chunk | ApiError
"""What the generation task hands the body: chunks, then possibly one error."""

UNFINISHED = "generation ended without a finish reason"
NDJSON_CONTENT_TYPE = "application/x-ndjson"


class ChunkEvents(Protocol):
    """One dialect's streamed events for one generation."""

    @property
    def finished(self) -> bool:
        """The final chunk (or an error) has been encoded: nothing more follows."""
        ...

    def opening(self) -> list[dict[str, Any]]:
        """Events sent at once, before any token (the client sees the response begin)."""
        ...

    def encode(self, chunk: Chunk) -> list[dict[str, Any]]:
        """The events for one chunk (none for an empty one)."""
        ...

    def error(self, error: ApiError) -> list[dict[str, Any]]:
        """The events that end the stream with `error`."""
        ...


@attrs.frozen
class Framing:
    """How a dialect writes its stream's events on the wire."""

    content_type: str
    event: Callable[[dict[str, Any]], bytes]
    closing: bytes = b""
    """Written after the last event (OpenAI's `data: [DONE]`)."""
    keepalive: bytes | None = KEEPALIVE
    """Written during long silences, so idle-timeout proxies keep the connection; None
    where the format has no line a client ignores (NDJSON)."""


def named_sse_event(body: dict[str, Any]) -> bytes:
    """An SSE event named by the body's `type` (Anthropic's and OpenAI Responses' style)."""
    return b"event: " + str(body["type"]).encode() + b"\n" + sse_event(body)


def ndjson_line(body: dict[str, Any]) -> bytes:
    return dumps(body).encode() + b"\n"


OPENAI_SSE = Framing(SSE_CONTENT_TYPE, sse_event, closing=DONE)
NAMED_SSE = Framing(SSE_CONTENT_TYPE, named_sse_event)
NDJSON = Framing(NDJSON_CONTENT_TYPE, ndjson_line, keepalive=None)


@attrs.frozen
class StreamSettings:
    keepalive_interval: float
    stalled_client_timeout: float


async def collect(node: NodeHandle, model_id: str, request: GenerationRequest) -> list[Chunk]:
    """Run the generation to its end; its chunks, the last one finishing it.

    Errors (entering, or during the generation) propagate: nothing has been sent yet, so the
    view answers with the error's status.
    """
    return (await collect_timed(node, model_id, request)).chunks


@attrs.frozen
class Collected:
    """A whole generation's chunks, and when (`time.monotonic_ns`) its first token came."""

    chunks: list[Chunk]
    first_token_ns: int | None


async def collect_timed(node: NodeHandle, model_id: str, request: GenerationRequest) -> Collected:
    """`collect`, noting when the first token arrived (Ollama's answers split their time
    into reading the prompt and generating, and clients divide by both)."""
    chunks: list[Chunk] = []
    first_token_ns: int | None = None
    async with node.open_generation(model_id, request) as stream:
        async for chunk in stream:
            _raise_if_failed(chunk)
            if first_token_ns is None and chunk.token_ids:
                first_token_ns = time.monotonic_ns()
            chunks.append(chunk)
            if chunk.finish_reason is not None:
                break
    if not chunks or chunks[-1].finish_reason is None:
        raise GenerationFailed(UNFINISHED)
    return Collected(chunks, first_token_ns)


async def open_stream(
    node: NodeHandle,
    model_id: str,
    request: GenerationRequest,
    events: ChunkEvents,
    framing: Framing,
    settings: StreamSettings,
) -> AsyncIterator[bytes]:
    """Start the generation in this request's exchange nursery and return the body.

    Errors entering the generation (`NoSession`, `ModelNotFound`) raise here, before any
    response is sent, so they get their HTTP status; later errors end the stream with the
    dialect's error events.
    """
    send, receive = trio.open_memory_channel[StreamItem](0)
    exchange = exchange_nursery()
    await exchange.start(
        _generate, node, model_id, request, send, settings.stalled_client_timeout, exchange
    )
    return _body(receive, events, framing, settings.keepalive_interval)


async def _generate(
    node: NodeHandle,
    model_id: str,
    request: GenerationRequest,
    send: trio.MemorySendChannel[StreamItem],
    stalled_client_timeout: float,
    exchange: trio.Nursery,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Feed the generation's chunks to `send`; end with a finishing chunk or an error.

    The channel has no buffer: a chunk is handed over only when the body is ready to write
    it, so a client that stops reading (its socket buffers full) stops the hand-over. Past
    `stalled_client_timeout` it is treated as gone: its exchange is cancelled, which ends
    the generation in the runner as a disconnect does.
    """
    started = False
    async with send:
        try:
            async with node.open_generation(model_id, request) as stream:
                task_status.started()
                started = True
                async for chunk in stream:
                    _raise_if_failed(chunk)
                    with trio.move_on_after(stalled_client_timeout) as stalled:
                        handed = await hand_over(send, chunk)
                    if stalled.cancelled_caught:
                        logger.warning(
                            "generation %s: the client has not read for %g s; treated as "
                            "disconnected",
                            request.request_id,
                            stalled_client_timeout,
                        )
                        exchange.cancel_scope.cancel()
                        return
                    if not handed or chunk.finish_reason is not None:
                        return
            raise GenerationFailed(UNFINISHED)
        except Exception as exc:
            if not started:
                raise
            error = find_api_error(exc)
            if error is None:
                logger.exception("generation %s failed unexpectedly", request.request_id)
                error = internal_error()
            await hand_over(send, error)


async def hand_over(send: trio.MemorySendChannel[T], item: T) -> bool:
    """Send `item`; False when the body has stopped reading (its exchange is ending)."""
    try:
        await send.send(item)
    except trio.BrokenResourceError:
        return False
    return True


async def _body(
    receive: trio.MemoryReceiveChannel[StreamItem],
    events: ChunkEvents,
    framing: Framing,
    keepalive_interval: float,
) -> AsyncIterator[bytes]:
    write = framing.event
    if opening := b"".join(write(body) for body in events.opening()):
        yield opening
    async with receive:
        while True:
            with trio.move_on_after(keepalive_interval) as silence:
                try:
                    item: StreamItem = await receive.receive()
                except trio.EndOfChannel:
                    item = ApiError(500, UNFINISHED, type="server_error", code="generation_failed")
            if silence.cancelled_caught:
                if framing.keepalive is not None:
                    yield framing.keepalive
                continue
            # What is ready now goes out in one write: each write is a system call, the
            # node's largest cost per token (a third of its CPU at 8 streams).
            bodies: list[dict[str, Any]] = []
            while True:
                if isinstance(item, ApiError):
                    bodies += events.error(item)
                    break
                bodies += events.encode(item)
                if events.finished:
                    break
                try:
                    item = receive.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            data = b"".join(write(body) for body in bodies)
            if isinstance(item, ApiError) or events.finished:
                yield data + framing.closing
                return
            if data:  # an empty write would end a chunked body
                yield data


def _raise_if_failed(chunk: Chunk) -> None:
    if chunk.finish_reason == "error":
        raise GenerationFailed(chunk.text or "generation failed")
