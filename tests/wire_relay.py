"""A TCP relay on 127.0.0.1 between two nodes that records every byte and can tamper with the
websocket messages it carries: flip one bit of one, or send one twice (a replay).

For tests of the peer links' encryption. Importable as `wire_relay` because pytest puts
`tests/` on the path (its conftest).
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable

import trio

OPCODE_BINARY = 0x2
HTTP_END = b"\r\n\r\n"


async def serve_loopback(
    handler: Callable[[trio.SocketStream], Awaitable[object]],
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `handler` on a free port of 127.0.0.1 until cancelled; `started(port)`."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handler, listeners)
        task_status.started(listeners[0].socket.getsockname()[1])


def frame_length(buffer: bytes | bytearray) -> int | None:
    """The length of the websocket frame at the start of `buffer` (RFC 6455 §5.2), or None
    while it is incomplete."""
    if len(buffer) < 2:
        return None
    masked, size = buffer[1] & 0x80, buffer[1] & 0x7F
    header = 2
    if size == 126:
        header += 2
        if len(buffer) < header:
            return None
        size = struct.unpack(">H", buffer[2:4])[0]
    elif size == 127:
        header += 8
        if len(buffer) < header:
            return None
        size = struct.unpack(">Q", buffer[2:10])[0]
    header += 4 if masked else 0
    total = header + size
    return total if len(buffer) >= total else None


def flip_payload_bit(frame: bytes) -> bytes:
    """`frame` with one bit of its payload's last byte flipped (masked or not, the payload's
    bit flips: masking is an XOR). The last byte is the AEAD tag's in a sealed message."""
    altered = bytearray(frame)
    altered[-1] ^= 0x01
    return bytes(altered)


class _Direction:
    """One direction of one connection: the HTTP upgrade, then whole frames."""

    def __init__(self, relay: WireRelay) -> None:
        self._relay = relay
        self._buffer = bytearray()
        self._upgraded = False

    def feed(self, data: bytes) -> list[bytes]:
        """What to forward now for `data` (whole frames only, once past the upgrade)."""
        self._buffer += data
        out: list[bytes] = []
        if not self._upgraded:
            end = self._buffer.find(HTTP_END)
            if end < 0:
                return out
            self._upgraded = True
            out.append(bytes(self._buffer[: end + len(HTTP_END)]))
            del self._buffer[: end + len(HTTP_END)]
        while (length := frame_length(self._buffer)) is not None:
            frame = bytes(self._buffer[:length])
            del self._buffer[:length]
            out.extend(self._relay.alter(frame))
        return out


class WireRelay:
    """Relays each connection to `127.0.0.1:target_port`, recording what passes.

    `tamper_next()` flips a bit in the next binary message either way; `replay_next()` sends
    the next binary message twice. `recorded` holds every byte as it arrived, both ways."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.recorded = bytearray()
        self.connections = 0
        self.tampered = 0
        self.replayed = 0
        self._tamper = 0
        self._replay = 0

    def tamper_next(self) -> None:
        self._tamper += 1

    def replay_next(self) -> None:
        self._replay += 1

    def alter(self, frame: bytes) -> list[bytes]:
        if frame[0] & 0x0F != OPCODE_BINARY:
            return [frame]
        if self._tamper:
            self._tamper -= 1
            self.tampered += 1
            return [flip_payload_bit(frame)]
        if self._replay:
            self._replay -= 1
            self.replayed += 1
            return [frame, frame]
        return [frame]

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self.port = await nursery.start(serve_loopback, self._relay)
            task_status.started(self.port)

    async def _relay(self, client: trio.SocketStream) -> None:
        self.connections += 1
        try:
            upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        except OSError:
            await client.aclose()
            return
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, client, upstream, nursery.cancel_scope)
            nursery.start_soon(self._pump, upstream, client, nursery.cancel_scope)

    async def _pump(
        self, source: trio.SocketStream, sink: trio.SocketStream, scope: trio.CancelScope
    ) -> None:
        direction = _Direction(self)
        try:
            while data := await source.receive_some(65536):
                self.recorded += data
                for chunk in direction.feed(data):
                    await sink.send_all(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()  # one side left: end the other too
