"""Run one chat completion through the node: collected into one response, or streamed as SSE.

A client that disconnects cancels its generation: quart-trio cancels the exchange nursery
(`trexo.api.exchange`) on `http.disconnect`; the task iterating the node's chunks gets
`trio.Cancelled` and leaves `node.open_generation(...)`, which cancels the generation.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import trio

from trexo.api.chat_request import ChatRequest
from trexo.api.chat_response import ChunkEncoder, completion_from_chunks
from trexo.api.errors import ApiError, find_api_error, internal_error
from trexo.api.exchange import exchange_nursery
from trexo.api.handle import NodeHandle
from trexo.api.sse import DONE, KEEPALIVE, sse_event
from trexo.errors import GenerationFailed
from trexo.types.chunks import Chunk

logger = logging.getLogger(__name__)

StreamItem = Chunk | ApiError
"""What the generation task hands the SSE body: chunks, then possibly one error."""

UNFINISHED = "generation ended without a finish reason"


async def complete(node: NodeHandle, chat: ChatRequest, *, created: int) -> dict[str, Any]:
    """Run the generation to its end and return the `chat.completion` object.

    Errors (entering, or during the generation) propagate: nothing has been sent yet, so the
    view answers with the error's status.
    """
    chunks: list[Chunk] = []
    async with node.open_generation(chat.model_id, chat.generation) as stream:
        async for chunk in stream:
            _raise_if_failed(chunk)
            chunks.append(chunk)
            if chunk.finish_reason is not None:
                break
    if not chunks or chunks[-1].finish_reason is None:
        raise GenerationFailed(UNFINISHED)
    return completion_from_chunks(
        chunks, request_id=chat.request_id, model=chat.model_id, created=created
    )


async def open_stream(
    node: NodeHandle,
    chat: ChatRequest,
    *,
    created: int,
    keepalive_interval: float,
    stalled_client_timeout: float,
) -> AsyncIterator[bytes]:
    """Start the generation in this request's exchange nursery and return the SSE body.

    Errors entering the generation (`NoSession`, `ModelNotFound`) raise here, before any
    response is sent, so they get their HTTP status; later errors end the stream with an
    error event.
    """
    send, receive = trio.open_memory_channel[StreamItem](0)
    exchange = exchange_nursery()
    await exchange.start(_generate, node, chat, send, stalled_client_timeout, exchange)
    encoder = ChunkEncoder(
        request_id=chat.request_id,
        model=chat.model_id,
        created=created,
        include_usage=chat.include_usage,
    )
    return _sse_body(receive, encoder, keepalive_interval)


async def _generate(
    node: NodeHandle,
    chat: ChatRequest,
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
            async with node.open_generation(chat.model_id, chat.generation) as stream:
                task_status.started()
                started = True
                async for chunk in stream:
                    _raise_if_failed(chunk)
                    with trio.move_on_after(stalled_client_timeout) as stalled:
                        handed = await _hand_over(send, chunk)
                    if stalled.cancelled_caught:
                        logger.warning(
                            "generation %s: the client has not read for %g s; treated as "
                            "disconnected",
                            chat.request_id,
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
                logger.exception("generation %s failed unexpectedly", chat.request_id)
                error = internal_error()
            await _hand_over(send, error)


async def _hand_over(send: trio.MemorySendChannel[StreamItem], item: StreamItem) -> bool:
    """Send `item`; False when the body has stopped reading (its exchange is ending)."""
    try:
        await send.send(item)
    except trio.BrokenResourceError:
        return False
    return True


async def _sse_body(
    receive: trio.MemoryReceiveChannel[StreamItem],
    encoder: ChunkEncoder,
    keepalive_interval: float,
) -> AsyncIterator[bytes]:
    yield sse_event(encoder.opening())  # at once: the client sees the response begin
    async with receive:
        while not encoder.finished:
            with trio.move_on_after(keepalive_interval) as silence:
                try:
                    item: StreamItem = await receive.receive()
                except trio.EndOfChannel:
                    item = ApiError(500, UNFINISHED, type="server_error", code="generation_failed")
            if silence.cancelled_caught:
                yield KEEPALIVE
                continue
            # What is ready now goes out in one write: each write is a system call, the
            # node's largest cost per token (a third of its CPU at 8 streams).
            events: list[bytes] = []
            while True:
                if isinstance(item, ApiError):
                    events.append(sse_event(item.body()))
                    break
                events.extend(sse_event(body) for body in encoder.encode(item))
                if encoder.finished:
                    break
                try:
                    item = receive.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            if isinstance(item, ApiError) or encoder.finished:
                yield b"".join(events) + DONE
                return
            yield b"".join(events)
    yield DONE


def _raise_if_failed(chunk: Chunk) -> None:
    if chunk.finish_reason == "error":
        raise GenerationFailed(chunk.text or "generation failed")
