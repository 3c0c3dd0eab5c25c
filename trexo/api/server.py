"""The API service: serves the app (`trexo.api.app.create_app`) with hypercorn's trio worker."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.logging import Logger as HypercornLogger
from hypercorn.trio import serve
from quart_trio import QuartTrio

from trexo.config import ApiConfig

SERVER_LOGGER = "trexo.api.server"
ACCESS_LOGGER = "trexo.api.access"


@attrs.define
class ApiServer:
    """Serves `app` on `config.host`/`config.port` until cancelled.

    `await nursery.start(server.run)` returns the bound URL (e.g. "http://127.0.0.1:52415",
    with the real port when `config.port` is 0) once the socket is listening. Cancelling
    stops it; in-flight requests are cancelled, so their generations are too.
    """

    app: QuartTrio
    config: ApiConfig = attrs.field(factory=ApiConfig)

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            # Hypercorn reports the addresses it bound once its sockets listen.
            binds: list[str] = await nursery.start(
                partial(
                    serve,
                    self.app,
                    hypercorn_config(self.config),
                    # Stop is cancellation (DESIGN §1): no graceful-shutdown trigger.
                    shutdown_trigger=trio.sleep_forever,
                )
            )
            task_status.started(binds[0])


def hypercorn_config(config: ApiConfig) -> HypercornConfig:
    hc = HypercornConfig()
    host = f"[{config.host}]" if ":" in config.host else config.host  # IPv6 literal
    hc.bind = [f"{host}:{config.port}"]
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
