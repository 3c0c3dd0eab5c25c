"""HTTP/1.x spoken by hand over trio sockets, for tests about connections themselves: who
closes, when, and what exactly went over the wire. (httpx would close or pool by itself.)"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import attrs
import trio

EOF_BOUND_S = 5.0
"""Generous: a server that closes does so in milliseconds; one that does not, never."""


@attrs.frozen
class RawResponse:
    status: int
    headers: dict[str, str]
    """Lower-case names; a repeated header keeps its last value."""
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def request_bytes(
    method: str,
    path: str,
    *,
    version: str = "1.1",
    headers: dict[str, str] | None = None,
    body: bytes = b"",
) -> bytes:
    lines = [f"{method} {path} HTTP/{version}"]
    all_headers = {"Host": "127.0.0.1"} if version == "1.1" else {}
    all_headers.update(headers or {})
    if body:
        all_headers["Content-Length"] = str(len(body))
    lines += [f"{name}: {value}" for name, value in all_headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def read_until_eof(stream: trio.SocketStream, bound: float = EOF_BOUND_S) -> bytes:
    """Everything the server sends until it closes; fails if it has not closed in `bound`."""
    received = bytearray()
    with trio.move_on_after(bound) as waited:
        while data := await stream.receive_some():
            received += data
    assert not waited.cancelled_caught, (
        f"the server did not close the connection within {bound} s; got {bytes(received)!r}"
    )
    return bytes(received)


async def read_response(stream: trio.SocketStream, buffer: bytearray) -> RawResponse:
    """One response with a Content-Length body, leaving what follows it in `buffer`."""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some()
        assert data, f"connection closed before a whole response head: {bytes(buffer)!r}"
        buffer += data
    head, _, _ = bytes(buffer).partition(b"\r\n\r\n")
    status, headers = _parse_head(head)
    length = int(headers.get("content-length", "0"))
    start = len(head) + 4
    while len(buffer) < start + length:
        data = await stream.receive_some()
        assert data, "connection closed in the middle of a response body"
        buffer += data
    body = bytes(buffer[start : start + length])
    del buffer[: start + length]
    return RawResponse(status, headers, body)


def parse_response(data: bytes) -> RawResponse:
    """A whole response read until EOF: chunked, Content-Length or close-delimited body."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    assert sep, f"no complete response head in {data!r}"
    status, headers = _parse_head(head)
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _dechunk(rest)
    elif "content-length" in headers:
        body = rest[: int(headers["content-length"])]
        assert len(body) == int(headers["content-length"]), "body shorter than Content-Length"
    else:
        body = rest
    return RawResponse(status, headers, body)


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    _, status, *_ = status_line.split(" ", 2)
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status), headers


def _dechunk(data: bytes) -> bytes:
    body = bytearray()
    while True:
        size_line, sep, data = data.partition(b"\r\n")
        assert sep, "chunked body ended without its last chunk"
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return bytes(body)
        body += data[:size]
        assert data[size : size + 2] == b"\r\n", "chunk not followed by CRLF"
        data = data[size + 2 :]


SLOW_BODY = (
    request_bytes(
        "POST",
        "/v1/chat/completions",
        headers={"Content-Type": "application/json", "Content-Length": "1000"},
    )
    + b'{"model":'
)
"""A request whose body never finishes: it keeps its connection busy (for the body timeout)."""
