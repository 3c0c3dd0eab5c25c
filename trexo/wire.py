"""The wire: one cattrs converter for every message type, JSON bodies, length-prefixed frames.

Tagged unions carry their member's class name under `"type"`, so a JSON body reads like
`{"type": "Generate", "request": {...}}`. Decoding never raises anything but `WireError`
subclasses: a bad payload becomes a clear, typed error for the receiver to report. Bodies are
parsed by `safe_json` (nesting depth, number sizes, strict UTF-8), then structured here.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import cattrs
import trio
from cattrs.gen import make_dict_unstructure_fn
from cattrs.strategies import configure_tagged_union

from trexo import safe_json
from trexo.config import MAX_FRAME_BYTES
from trexo.errors import FrameTooLarge, MalformedMessage, TruncatedFrame
from trexo.types import (
    chunks,
    commands,
    election,
    events,
    fetch,
    ipc,
    local_events,
    runner_status,
    snapshot,
    stream,
)

TAG_FIELD = "type"
HEADER = struct.Struct(">I")
"""4-byte big-endian body length."""
RECEIVE_CHUNK_BYTES = 64 * 1024

converter = cattrs.Converter(forbid_extra_keys=True)
_union_names: dict[Any, str] = {}
_union_tags: dict[Any, frozenset[str]] = {}


def _strict(kind: type, *, accept: tuple[type, ...] = ()) -> Any:
    """A structure hook that refuses silent coercion ("3" for 3, 1 for True)."""
    allowed = (kind, *accept)

    def structure(value: Any, _: Any) -> Any:
        if isinstance(value, bool) and kind is not bool:
            raise TypeError(f"expected {kind.__name__}, got bool")
        if not isinstance(value, allowed):
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
        return kind(value)

    return structure


converter.register_structure_hook(str, _strict(str))
converter.register_structure_hook(int, _strict(int))
converter.register_structure_hook(float, _strict(float, accept=(int,)))
converter.register_structure_hook(bool, _strict(bool))


def register_union(union: Any, name: str) -> None:
    """Make `union` (an `A | B | ...` of attrs classes) structure by its `"type"` tag."""
    configure_tagged_union(union, converter, tag_name=TAG_FIELD, tag_generator=_class_tag)
    _union_names[union] = name
    _union_tags[union] = frozenset(_class_tag(member) for member in union.__args__)


def _class_tag(cl: type) -> str:
    return cl.__name__


# A chunk goes over the wire per token: what it leaves at its default (no tool calls, no
# log probabilities, no stop sequence, no reasoning: nearly every chunk) is left out, not
# sent as nulls.
converter.register_unstructure_hook(
    chunks.Chunk,
    make_dict_unstructure_fn(chunks.Chunk, converter, _cattrs_omit_if_default=True),
)

register_union(runner_status.RunnerStatus, "RunnerStatus")
register_union(ipc.ToRunner, "ToRunner")
register_union(ipc.FromRunner, "FromRunner")
register_union(commands.Command, "Command")
register_union(events.Event, "Event")
register_union(local_events.LocalEvent, "LocalEvent")
register_union(stream.StreamItem, "StreamItem")
register_union(snapshot.GlobalItem, "GlobalItem")
register_union(election.ElectionMessage, "ElectionMessage")
register_union(fetch.FetchEvent, "FetchEvent")


def to_json(msg: object, as_type: Any) -> bytes:
    """Encode `msg` as JSON; `as_type` is the declared type (a union adds the tag)."""
    return json.dumps(converter.unstructure(msg, as_type), separators=(",", ":")).encode()


def from_json(data: bytes | str, as_type: Any) -> Any:
    """Decode JSON into `as_type`, or raise `MalformedMessage` saying what is wrong."""
    return structure(safe_json.loads(data), as_type)


def structure(raw: Any, as_type: Any) -> Any:
    """A parsed JSON value (from `safe_json.loads`) as `as_type`, or `MalformedMessage`."""
    name = _type_name(as_type)
    if as_type in _union_tags:
        _check_tag(raw, name, _union_tags[as_type])
    try:
        return converter.structure(raw, as_type)
    except Exception as exc:  # cattrs raises several kinds; all mean "invalid message"
        raise MalformedMessage(f"invalid {name}: {_describe(exc)}") from None


def _check_tag(raw: Any, name: str, tags: frozenset[str]) -> None:
    if not isinstance(raw, dict):
        raise MalformedMessage(f"invalid {name}: expected a JSON object, got {type(raw).__name__}")
    tag = raw.get(TAG_FIELD)
    if not isinstance(tag, str) or tag not in tags:  # a list or an object is unhashable
        raise MalformedMessage(
            f"invalid {name}: {TAG_FIELD!r} is {safe_json.excerpt(tag)}, "
            f"expected one of {sorted(tags)}"
        )


def _type_name(as_type: Any) -> str:
    return _union_names.get(as_type) or getattr(as_type, "__name__", None) or str(as_type)


def _describe(exc: BaseException) -> str:
    try:
        if isinstance(exc, cattrs.BaseValidationError):
            leaves = cattrs.transform_error(exc, path="message", format_exception=_format_leaf)
            return safe_json.bounded("; ".join(leaves))
        return safe_json.bounded(f"{type(exc).__name__}: {exc}")
    except Exception:  # describing a hostile value must not be what fails
        return type(exc).__name__


def _format_leaf(exc: BaseException, _type: Any) -> str:
    if isinstance(exc, KeyError):
        return "required field missing"
    return str(exc) or type(exc).__name__


# --- frames ------------------------------------------------------------------------------


def encode_frame(body: bytes, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    if len(body) > max_frame_bytes:
        raise FrameTooLarge(f"frame body of {len(body)} bytes exceeds {max_frame_bytes}")
    return HEADER.pack(len(body)) + body


class FramedStream:
    """Length-prefixed frames over a trio byte stream. Sends are serialised by a lock."""

    def __init__(self, stream: trio.abc.Stream, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.stream = stream
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._send_lock = trio.Lock()

    async def send_frame(self, body: bytes) -> None:
        frame = encode_frame(body, self.max_frame_bytes)
        async with self._send_lock:
            await self.stream.send_all(frame)

    async def send_message(self, msg: object, as_type: Any) -> None:
        await self.send_frame(to_json(msg, as_type))

    async def receive_frame(self) -> bytes:
        """The next frame's body. `trio.EndOfChannel` on a clean EOF between frames."""
        if not await self._fill(HEADER.size, at_boundary=True):
            raise trio.EndOfChannel
        (length,) = HEADER.unpack_from(self._buffer)
        if length > self.max_frame_bytes:
            raise FrameTooLarge(
                f"frame header announces {length} bytes, limit {self.max_frame_bytes}"
            )
        await self._fill(HEADER.size + length, at_boundary=False)
        body = bytes(self._buffer[HEADER.size : HEADER.size + length])
        del self._buffer[: HEADER.size + length]
        return body

    async def receive_message(self, as_type: Any) -> Any:
        return from_json(await self.receive_frame(), as_type)

    async def _fill(self, size: int, *, at_boundary: bool) -> bool:
        """Buffer at least `size` bytes; False on EOF with an empty buffer at a boundary."""
        while len(self._buffer) < size:
            data = await self.stream.receive_some(RECEIVE_CHUNK_BYTES)
            if not data:
                if at_boundary and not self._buffer:
                    return False
                raise TruncatedFrame(
                    f"stream ended after {len(self._buffer)} of {size} bytes of a frame"
                )
            self._buffer += data
        return True

    async def aclose(self) -> None:
        await self.stream.aclose()
