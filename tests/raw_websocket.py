"""A websocket client of wsproto over a TCP stream, able to send frames no library would.

For tests of what a node does with a peer whose websocket protocol breaks. Importable as
`raw_websocket` because pytest puts `tests/` on the path (its conftest).
"""

from __future__ import annotations

import os
import struct

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Event,
    Message,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)

from trexo import wire
from trexo.config import PROTOCOL_VERSION
from trexo.net import handshake as hs
from trexo.net.secure_channel import EphemeralKey
from trexo.net.transport import RESOURCE
from trexo.types.ids import NodeId

OPCODE_CONTINUATION, OPCODE_TEXT, OPCODE_CLOSE, OPCODE_PING = 0x0, 0x1, 0x8, 0x9


def frame(
    opcode: int, payload: bytes, *, fin: bool = True, mask: bool = True, rsv: int = 0
) -> bytes:
    """One websocket frame, as RFC 6455 §5.2 lays it out (valid or not)."""
    first = (0x80 if fin else 0) | rsv << 4 | opcode
    mask_bit = 0x80 if mask else 0
    size = len(payload)
    if size < 126:
        header = bytes([first, mask_bit | size])
    elif size < 1 << 16:
        header = bytes([first, mask_bit | 126]) + struct.pack(">H", size)
    else:
        header = bytes([first, mask_bit | 127]) + struct.pack(">Q", size)
    if not mask:
        return header + payload
    key = os.urandom(4)
    return header + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


INVALID_FRAMES = {
    "unmasked": frame(OPCODE_TEXT, b"hi", mask=False),  # clients must mask
    "reserved-opcode": frame(0x3, b"x"),
    "reserved-bits": frame(OPCODE_TEXT, b"x", rsv=0b100),  # no extension negotiated
    "invalid-utf8-text": frame(OPCODE_TEXT, b"\xff\xfe"),
    "fragmented-ping": frame(OPCODE_PING, b"x", fin=False),
    "continuation-first": frame(OPCODE_CONTINUATION, b"x"),
    "bad-close-code": frame(OPCODE_CLOSE, struct.pack(">H", 999)),
    "oversize-ping": frame(OPCODE_PING, b"x" * 200),  # control frames carry <= 125 bytes
}
"""Frames that break the websocket protocol, each one a different way."""


class RawWebSocket:
    def __init__(self, stream: trio.SocketStream, host: str) -> None:
        self.stream = stream
        self.host = host
        self.ws = WSConnection(ConnectionType.CLIENT)
        self._events: list[Event] = []

    @classmethod
    async def connect(cls, port: int, host: str = "127.0.0.1") -> RawWebSocket:
        return cls(await trio.open_tcp_stream(host, port), f"{host}:{port}")

    async def upgrade(self, path: str = RESOURCE) -> int:
        """Ask for the websocket; the answer's HTTP status (101 when accepted)."""
        await self.stream.send_all(self.ws.send(Request(host=self.host, target=path)))
        while True:
            event = await self.next_event()
            if isinstance(event, AcceptConnection):
                return 101
            if isinstance(event, RejectConnection):
                return event.status_code
            if event is None:
                raise ConnectionError("closed during the upgrade")

    async def send_text(self, text: str) -> None:
        await self.stream.send_all(self.ws.send(Message(data=text)))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive_text(self) -> str:
        """The next whole text message (pings are answered on the way)."""
        parts: list[str] = []
        while True:
            event = await self.next_event()
            if event is None or isinstance(event, CloseConnection):
                raise ConnectionError(f"closed while awaiting a message: {event!r}")
            if isinstance(event, TextMessage):
                parts.append(event.data)
                if event.message_finished:
                    return "".join(parts)

    async def next_event(self) -> Event | None:
        """The next event from the server, or None at EOF (or a reset)."""
        while not self._events:
            try:
                data = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
            if not data:
                return None
            self.ws.receive_data(data)
            for event in self.ws.events():
                if isinstance(event, Ping):
                    await self.stream.send_all(self.ws.send(event.response()))
                else:
                    self._events.append(event)
        return self._events.pop(0)

    async def close_code(self) -> int | None:
        """Read until the server ends the connection: its close code, or None if it just
        dropped the TCP connection. Reads past a close frame to the EOF."""
        code = None
        while (event := await self.next_event()) is not None:
            if isinstance(event, CloseConnection):
                code = event.code
        return code

    async def handshake(self, name: str) -> None:
        """The dialler's side of trexo's handshake, without a cluster secret."""
        me = hs.Identity(NodeId(name), "trexo", PROTOCOL_VERSION, 1)
        await self.send_text(
            wire.to_json(me.hello((), EphemeralKey()), hs.HandshakeMessage).decode()
        )
        theirs = wire.from_json(await self.receive_text(), hs.HandshakeMessage)
        assert isinstance(theirs, hs.Hello), theirs
        await self.send_text(wire.to_json(hs.Proof(None), hs.HandshakeMessage).decode())
        ready = wire.from_json(await self.receive_text(), hs.HandshakeMessage)
        assert isinstance(ready, hs.Ready), ready

    async def aclose(self) -> None:
        await self.stream.aclose()
