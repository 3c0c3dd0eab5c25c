"""The API service: serves the app (`trexo.api.app.create_app`) with hypercorn's trio worker.

`serve` is `hypercorn.trio.serve` for HTTP, or HTTPS with `tls_cert`/`tls_key` (hypercorn's
own TLS: its SSL context, ALPN for HTTP/2), with two things hypercorn's config cannot
express (`trexo.api.connections`): a cap on concurrent connections, and an accept loop that
waits out a lack of file descriptors. Its pieces (lifespan, `TCPServer` per connection)
are hypercorn's own; only the listening loop is ours.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.logging import Logger as HypercornLogger
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState, LifespanState
from hypercorn.utils import repr_socket_addr, wrap_app
from quart_trio import QuartTrio

from trexo.api.connections import ConnectionCap, PatientListener
from trexo.config import API_FD_RESERVE, ApiConfig
from trexo.fd_limit import fd_soft_limit

SERVER_LOGGER = "trexo.api.server"
OLLAMA_PORT_KEY = "TREXO_OLLAMA_PORT"
"""The app config key holding the Ollama listener's bound port (absent: no listener)."""
ACCESS_LOGGER = "trexo.api.access"

log = logging.getLogger(SERVER_LOGGER)


@attrs.define
class ApiServer:
    """Serves `app` on `config.host`/`config.port` until cancelled.

    `await nursery.start(server.run)` returns the bound URL (e.g. "http://127.0.0.1:52415",
    with the real port when `config.port` is 0) once the socket is listening. Cancelling
    stops it; in-flight requests are cancelled, so their generations are too.

    With `config.ollama_port`, the same app also listens there (`ollama_url`), so that
    Ollama clients find it at their default address.
    """

    app: QuartTrio
    config: ApiConfig = attrs.field(factory=ApiConfig)
    cap: ConnectionCap = attrs.field(init=False)
    urls: tuple[str, ...] = attrs.field(default=(), init=False)
    """The bound URLs once listening: the API's, then the Ollama listener's."""

    def __attrs_post_init__(self) -> None:
        limit = connection_limit(self.config.max_connections, fd_soft_limit())
        self.cap = ConnectionCap(limit, retry_after=self.config.retry_after)

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        if self.cap.limit < self.config.max_connections:
            log.warning(
                "serving at most %d HTTP connections, not %d: the file descriptor limit is %d",
                self.cap.limit,
                self.config.max_connections,
                fd_soft_limit(),
            )
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(
                serve, self.app, hypercorn_config(self.config), self.cap
            )
            self.urls = tuple(binds)
            if len(binds) > 1:  # the app tells the Ollama listener's requests by this port
                self.app.config[OLLAMA_PORT_KEY] = int(binds[1].rsplit(":", 1)[1])
            task_status.started(binds[0])

    @property
    def ollama_url(self) -> str | None:
        """The Ollama listener's bound URL, once listening; None without one."""
        return self.urls[1] if len(self.urls) > 1 else None


def connection_limit(configured: int, fd_limit: int) -> int:
    """The connection cap: `configured`, lowered to leave `API_FD_RESERVE` descriptors (at
    least half of `fd_limit`) to the rest of the node."""
    return max(1, min(configured, max(fd_limit - API_FD_RESERVE, fd_limit // 2)))


async def serve(
    app: Any,
    config: HypercornConfig,
    cap: ConnectionCap,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the ASGI `app` on `config.bind` until cancelled: HTTPS if `config` has a
    certificate (`config.ssl_enabled`), else plain HTTP.

    Reports the bound URLs. Stop is cancellation (README, Architecture): no graceful shutdown.
    """
    asgi = wrap_app(app, config.wsgi_max_body_size, "asgi")
    lifespan_state: LifespanState = {}
    lifespan = Lifespan(asgi, config, lifespan_state)
    context = WorkerContext(None)
    async with trio.open_nursery() as nursery:
        await nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        listeners: list[trio.abc.Listener[trio.abc.Stream]] = []
        binds: list[str] = []
        sockets = config.create_sockets()  # with a certificate, every bind is a secure one
        ssl_context = config.create_ssl_context() if config.ssl_enabled else None
        for sock in [*sockets.secure_sockets, *sockets.insecure_sockets]:
            sock.listen(config.backlog)
            listener: trio.abc.Listener[trio.abc.Stream] = PatientListener(
                trio.SocketListener(trio.socket.from_stdlib_socket(sock))
            )
            scheme = "http"
            if ssl_context is not None:
                listener = trio.SSLListener(listener, ssl_context, https_compatible=True)
                scheme = "https"
            listeners.append(listener)
            binds.append(f"{scheme}://{repr_socket_addr(sock.family, sock.getsockname())}")
        connection = partial(
            _TCPServer, asgi, config, context, ConnectionState(lifespan_state.copy())
        )
        await nursery.start(trio.serve_listeners, cap.wrap(connection), listeners)
        task_status.started(binds)


class _TCPServer(TCPServer):
    """Hypercorn's connection, closed as soon as its client is: hypercorn keeps an idle
    connection (no request in flight) whose client closed until its keep-alive timer ends
    (5 s), holding its file descriptor and its place under the connection cap."""

    async def _read_data(self) -> None:
        await super()._read_data()
        await self.idle_task.stop()  # nothing more will be read: no keep-alive to time


def hypercorn_config(config: ApiConfig) -> HypercornConfig:
    hc = HypercornConfig()
    host = f"[{config.host}]" if ":" in config.host else config.host  # IPv6 literal
    # One socket per bind, in this order: the API's URL is reported first.
    hc.bind = [f"{host}:{config.port}"]
    if config.ollama_port is not None:
        hc.bind.append(f"{host}:{config.ollama_port}")
    if config.tls_cert is not None:
        hc.certfile = str(config.tls_cert)
        hc.keyfile = None if config.tls_key is None else str(config.tls_key)
    hc.accesslog = logging.getLogger(ACCESS_LOGGER)
    hc.errorlog = logging.getLogger(SERVER_LOGGER)
    hc.logger_class = _AccessLogAtDebug
    return hc


class _AccessLogAtDebug(HypercornLogger):
    """Hypercorn logs each request at INFO; a node's log wants them only at DEBUG."""

    async def access(self, request: Any, response: Any, request_time: float) -> None:
        logger = self.access_logger
        if logger is not None and logger.isEnabledFor(logging.DEBUG):
            logger.debug(self.access_log_format, self.atoms(request, response, request_time))
