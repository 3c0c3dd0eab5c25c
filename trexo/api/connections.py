"""Connection-level limits of the API server, below HTTP: what hypercorn does not bound.

- `ConnectionCap` serves at most `limit` connections at once. Each holds a file descriptor
  (an idle keep-alive client, a slow upload, a long stream alike), and a node out of
  descriptors cannot spawn a runner, open its event log or read /proc; so past the cap a
  connection is answered 503 with `Retry-After` and an OpenAI-style body, then closed.
- `PatientListener` makes `accept` wait out a lack of file descriptors: the client stays
  queued in the kernel's backlog until one is free, and the log gets one line per episode
  (trio's `serve_listeners` would log a traceback every 100 ms).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Awaitable, Callable

import attrs
import trio

from trexo.api.errors import SERVER_ERROR, ApiError
from trexo.api.sse import dumps
from trexo.config import (
    API_ACCEPT_RETRY_S,
    API_MAX_CONNECTIONS,
    API_MAX_LINGERING,
    API_REFUSE_DRAIN_S,
    API_REFUSE_LINGER_S,
    API_RETRY_AFTER_S,
)

log = logging.getLogger(__name__)

ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""`accept` failures that mean "no resources now", not "this listener is broken"."""
LINGER_READ_BYTES = 64 * 1024
"""A lingering refused connection reads at most this much before it is closed anyway."""
REFUSAL_LOG_INTERVAL_S = 10.0
"""Refusals are logged at most this often: a flood of clients must not flood the log."""

Handler = Callable[[trio.abc.Stream], Awaitable[object]]


@attrs.frozen
class ConnectionStatistics:
    """A snapshot of a `ConnectionCap`, in the style of trio's `statistics()` objects."""

    limit: int
    active: int
    """Connections being served now."""
    refused: int
    """Connections answered 503 since the cap was made."""


@attrs.define
class ConnectionCap:
    """Serves at most `limit` connections at once; refuses the others with a 503."""

    limit: int = API_MAX_CONNECTIONS
    retry_after: float = API_RETRY_AFTER_S
    linger: float = API_REFUSE_LINGER_S
    max_lingering: int = API_MAX_LINGERING
    drain: float = API_REFUSE_DRAIN_S
    _active: int = 0
    _lingering: int = 0
    _refused: int = 0
    _warned_at: float | None = None

    def statistics(self) -> ConnectionStatistics:
        return ConnectionStatistics(self.limit, self._active, self._refused)

    def wrap(self, handler: Handler) -> Handler:
        """`handler`, run only for connections within the cap."""

        async def serve_or_refuse(stream: trio.abc.Stream) -> None:
            if self._active >= self.limit:
                await self._refuse(stream)
                return
            self._active += 1
            try:
                await handler(stream)
            finally:
                self._active -= 1

        return serve_or_refuse

    def refusal(self) -> bytes:
        """The whole HTTP response a connection over the cap gets."""
        error = ApiError(
            503,
            f"The server is serving its limit of {self.limit} connections; try again shortly.",
            type=SERVER_ERROR,
            code="too_many_connections",
            retry_after_s=self.retry_after,
        )
        body = dumps(error.body()).encode()
        head = [
            "HTTP/1.1 503 Service Unavailable",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            *(f"{name}: {value}" for name, value in error.headers().items()),
            "Connection: close",
        ]
        return ("\r\n".join(head) + "\r\n\r\n").encode() + body

    async def _refuse(self, stream: trio.abc.Stream) -> None:
        """Answer 503 and close; the caller (`serve_listeners`) closes the stream for good."""
        self._refused += 1
        now = trio.current_time()
        if self._warned_at is None or now - self._warned_at >= REFUSAL_LOG_INTERVAL_S:
            self._warned_at = now
            log.warning(
                "refused a connection with 503: %d connections are being served (the limit); "
                "%d refused in all",
                self._active,
                self._refused,
            )
        linger = self._lingering < self.max_lingering
        self._lingering += int(linger)
        try:
            with trio.move_on_after(self.linger):
                await stream.send_all(self.refusal())
                if isinstance(stream, trio.abc.HalfCloseableStream):  # not TLS
                    await stream.send_eof()
                # Closing with unread request bytes would send a reset, which may reach the
                # client before it read the answer: read them first, for a bounded time
                # (past the lingering limit, only what has come already: a flood is cheap).
                with trio.move_on_after(self.linger if linger else self.drain):
                    read = 0
                    while read < LINGER_READ_BYTES:
                        data = await stream.receive_some()
                        if not data:
                            break
                        read += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client left first: nothing to answer
        finally:
            self._lingering -= int(linger)


class PatientListener(trio.abc.Listener[trio.SocketStream]):
    """A socket listener whose `accept` waits while the process is out of descriptors."""

    def __init__(self, listener: trio.SocketListener, retry: float = API_ACCEPT_RETRY_S) -> None:
        self._listener = listener
        self._retry = retry

    async def accept(self) -> trio.SocketStream:
        failed_since: float | None = None
        while True:
            try:
                stream = await self._listener.accept()
            except OSError as exc:
                if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                    raise
                if failed_since is None:
                    failed_since = trio.current_time()
                    log.warning(
                        "cannot accept connections: %s (%s); clients wait queued, "
                        "retrying every %g s",
                        os.strerror(exc.errno),
                        errno.errorcode[exc.errno],
                        self._retry,
                    )
                await trio.sleep(self._retry)
                continue
            if failed_since is not None:
                log.warning(
                    "accepting connections again after %.1f s", trio.current_time() - failed_since
                )
            return stream

    async def aclose(self) -> None:
        await self._listener.aclose()
