"""A nursery per HTTP exchange, so a view can start a task that lives exactly as long as its
request: until the response is sent, or the client disconnects.

quart-trio already runs each exchange in a nursery of two tasks: one reads ASGI messages and
cancels the nursery on `http.disconnect`, the other runs the view and then sends the
response (iterating a streaming body in the same task), and cancels the nursery when done.
We hand that nursery to the view. A streaming view cannot own its generation any other way:
it returns before the body is iterated, and a body generator that entered the generation's
context would hold the node's cancel scopes across `yield`s, and would never exit them if
the client left before the body was first iterated.

The same connection class works around a hypercorn/quart-trio bug that left every HTTP/1.0
and `Connection: close` connection open after its response (see `_closing_send` and
docs/upstream/hypercorn-connection-close.md).
"""

from __future__ import annotations

from contextvars import ContextVar

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, ASGISendEvent
from quart_trio.asgi import TrioASGIHTTPConnection
from quart_trio.wrappers import TrioRequest

_exchange_nursery: ContextVar[trio.Nursery] = ContextVar("trexo_exchange_nursery")


class ExchangeHTTPConnection(TrioASGIHTTPConnection):
    """quart-trio's HTTP connection, making its nursery visible to the view it runs."""

    async def __call__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        await super().__call__(receive, _closing_send(send))

    async def handle_request(  # type: ignore[override]
        self, nursery: trio.Nursery, request: TrioRequest, send: ASGISendCallable
    ) -> None:
        # The view runs in this task, so it sees the variable; no other request does.
        _exchange_nursery.set(nursery)
        await super().handle_request(nursery, request, send)


def exchange_nursery() -> trio.Nursery:
    """The current request's exchange nursery (inside a view of an `ExchangeHTTPConnection`).

    Its tasks are cancelled when the client disconnects and when the response has been sent.
    """
    try:
        return _exchange_nursery.get()
    except LookupError:
        raise RuntimeError("not inside a request served by ExchangeHTTPConnection") from None


def _closing_send(send: ASGISendCallable) -> ASGISendCallable:
    """`send`, shielding the response's last message from the exchange's cancellation.

    Hypercorn handles that message by finishing the response and, when the connection
    must close (HTTP/1.0, `Connection: close`), by closing the socket, all inside this
    `send`; but on the way it tells the app `http.disconnect`, on which quart-trio cancels
    the exchange nursery that runs this very `send`, and the close is cancelled before it
    happens: the socket stays open until the client gives up. What the shield adds to
    hypercorn's own (it shields its socket writes already) is only that close.
    """

    async def closing_send(message: ASGISendEvent) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            with trio.CancelScope(shield=True):
                await send(message)
        else:
            await send(message)

    return closing_send
