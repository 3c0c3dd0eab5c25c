"""Hostile input to the wire's decoders (`safe_json.loads`, `wire.from_json`, `FramedStream`):
whatever arrives, the only errors out of them are `WireError`s."""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import struct
import sys
from typing import Any

import pytest
import trio
from hostile_json import (
    deep,
    depth_of,
    hostile_bytes,
    hostile_text,
    json_alphabet_text,
    nest,
    shaped_like,
    values,
    with_known_killers,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from trexo import safe_json, wire
from trexo.config import MAX_JSON_DEPTH, MAX_JSON_INT_DIGITS
from trexo.errors import FrameTooLarge, MalformedMessage, WireError
from trexo.types import commands, election, events, ipc, local_events, runner_status, stream

UNIONS = [
    ipc.ToRunner,
    ipc.FromRunner,
    commands.Command,
    events.Event,
    local_events.LocalEvent,
    stream.StreamItem,
    election.ElectionMessage,
    runner_status.RunnerStatus,
]
unions = st.sampled_from(UNIONS)
TOO_DEEP = "nested deeper than"


def decodes_or_refuses(data: bytes | str, as_type: Any) -> None:
    """Decode; a `WireError` is a fine answer, anything else fails the test."""
    with contextlib.suppress(WireError):
        wire.from_json(data, as_type)


# --- anything at all -----------------------------------------------------------------------


@given(doc=hostile_text, as_type=unions)
@with_known_killers("doc", as_type=ipc.ToRunner)
def test_hostile_text_gives_only_wire_errors(doc: str, as_type: Any) -> None:
    decodes_or_refuses(doc, as_type)


@given(body=hostile_bytes, as_type=unions)
def test_hostile_bytes_give_only_wire_errors(body: bytes, as_type: Any) -> None:
    decodes_or_refuses(body, as_type)


@given(data=st.data(), as_type=unions)
def test_right_tags_with_wrong_contents_give_only_wire_errors(
    data: st.DataObject, as_type: Any
) -> None:
    doc = data.draw(shaped_like(as_type))
    decodes_or_refuses(doc, as_type)
    decodes_or_refuses(doc.encode(), as_type)


# --- nesting ---------------------------------------------------------------------------------


@given(doc=deep)
def test_deep_nesting_is_refused(doc: str) -> None:
    with pytest.raises(MalformedMessage, match="not valid JSON"):
        wire.from_json(doc, ipc.ToRunner)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1_000, 100_000, 512 * 1024])
@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_deep_nesting_is_refused_without_recursing(depth: int, opener: str) -> None:
    doc = nest(depth, opener, "1")
    # Room for the decoder's own frames only: a parser that recursed per level would raise
    # RecursionError here long before it reached the nesting limit.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + 30)
    try:
        with pytest.raises(MalformedMessage, match=TOO_DEEP):
            wire.from_json(doc, ipc.ToRunner)
    finally:
        sys.setrecursionlimit(limit)


def test_the_depth_limit_itself_is_accepted() -> None:
    half = MAX_JSON_DEPTH // 2
    for doc in (
        nest(MAX_JSON_DEPTH),
        nest(MAX_JSON_DEPTH, '{"a":', "1"),
        nest(half, '[{"type":', "1"),
    ):
        assert depth_of(safe_json.loads(doc)) == MAX_JSON_DEPTH
    for doc in (nest(MAX_JSON_DEPTH + 1), nest(half, '[{"type":', "[]")):
        with pytest.raises(MalformedMessage, match=TOO_DEEP):
            safe_json.loads(doc)


@given(value=values, limit=st.integers(0, 6), ascii_only=st.booleans())
def test_the_depth_scan_counts_exactly(value: Any, limit: int, ascii_only: bool) -> None:
    """Brackets, quotes and backslashes inside strings do not count; structure does."""
    doc = json.dumps(value, ensure_ascii=ascii_only)
    if depth_of(value) <= limit:
        assert safe_json.loads(doc, max_depth=limit) == value
    else:
        with pytest.raises(MalformedMessage, match=TOO_DEEP):
            safe_json.loads(doc, max_depth=limit)


@given(doc=json_alphabet_text)
def test_safe_loads_agrees_with_json_on_arbitrary_text(doc: str) -> None:
    try:
        expected = json.loads(doc)
    except ValueError:
        with pytest.raises(MalformedMessage):
            safe_json.loads(doc)
        return
    if depth_of(expected) > MAX_JSON_DEPTH or _refused_by_design(expected):
        with pytest.raises(MalformedMessage):
            safe_json.loads(doc)
        return
    assert safe_json.loads(doc) == expected


def _refused_by_design(value: Any) -> bool:
    """Valid JSON to Python that we refuse: integers past 20 digits, floats past the range."""
    if isinstance(value, dict):
        return any(_refused_by_design(v) for v in value.values())
    if isinstance(value, list):
        return any(_refused_by_design(v) for v in value)
    if isinstance(value, float):
        return math.isinf(value)
    return isinstance(value, int) and len(str(abs(value))) > MAX_JSON_INT_DIGITS


# --- numbers, constants, encodings ----------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ("9" * 100_000, "100000 digits"),  # past Python's own int-string limit too
        ("-" + "9" * (MAX_JSON_INT_DIGITS + 1), f"{MAX_JSON_INT_DIGITS + 1} digits"),
        ("1e999999", "out of range"),
        ("[-1e400]", "out of range"),
        ('{"x": NaN}', "NaN is not valid JSON"),
        ("Infinity", "Infinity is not valid JSON"),
        ("[-Infinity]", "-Infinity is not valid JSON"),
        ('"\\ud800"', "lone surrogate"),
        ('{"\\udfff": 1}', "lone surrogate"),
        ('["ok", ["\\ud83d"]]', "lone surrogate"),
    ],
)
def test_numbers_constants_and_surrogates_are_refused(doc: str, says: str) -> None:
    for data in (doc, doc.encode()):
        with pytest.raises(MalformedMessage, match="not valid JSON") as info:
            safe_json.loads(data)
        assert says in str(info.value)


def test_what_is_fine_stays_fine() -> None:
    assert safe_json.loads("9" * MAX_JSON_INT_DIGITS) == int("9" * MAX_JSON_INT_DIGITS)
    assert safe_json.loads(str(-(2**63))) == -(2**63)
    assert safe_json.loads("1e308") == 1e308
    assert safe_json.loads("0." + "0" * 1000 + "1") == 0.0
    assert safe_json.loads('"\\ud83d\\ude00"') == "\U0001f600"  # an escaped pair is one char
    assert safe_json.loads('"\\\\ud800"') == "\\ud800"  # an escaped backslash, no surrogate
    assert safe_json.loads('"\\ud800"', allow_lone_surrogates=True) == "\ud800"


@pytest.mark.parametrize(
    "body",
    [b"\xff", b'"\xed\xa0\x80"', b'"\xc0\xaf"', b"\xfe\xff\x00{\x00}", b'{"a": "\x80"}'],
    ids=["ff", "encoded-surrogate", "overlong", "utf16-bom", "stray-continuation"],
)
def test_bytes_must_be_utf8(body: bytes) -> None:
    with pytest.raises(MalformedMessage, match="not UTF-8"):
        wire.from_json(body, ipc.ToRunner)


def test_a_str_holding_a_lone_surrogate_is_refused() -> None:
    with pytest.raises(MalformedMessage, match="lone surrogate"):
        safe_json.loads('{"type": "Cancel", "request_id": "\ud800"}')


def test_unhashable_tags_are_refused() -> None:
    for tag in ("[]", "{}", '[["Cancel"]]'):
        with pytest.raises(MalformedMessage, match="'type' is"):
            wire.from_json(f'{{"type": {tag}, "request_id": "r"}}', ipc.ToRunner)


def test_error_messages_quote_little_of_a_huge_value() -> None:
    huge = "x" * 1_000_000
    with pytest.raises(MalformedMessage) as info:
        wire.from_json(json.dumps({"type": huge}), ipc.ToRunner)
    assert len(str(info.value)) < 1_000
    with pytest.raises(MalformedMessage) as info:
        wire.from_json(json.dumps({"type": "Cancel", "request_id": "r", huge: 1}), ipc.ToRunner)
    assert len(str(info.value)) < 1_000


# --- frames over a real socket ----------------------------------------------------------------

MAX_TEST_FRAME = 4096

frames = st.one_of(
    hostile_bytes.map(lambda body: struct.pack(">I", len(body)) + body),  # honest header
    st.tuples(st.integers(0, 2**32 - 1), hostile_bytes).map(  # lying header
        lambda lb: struct.pack(">I", lb[0]) + lb[1]
    ),
    st.binary(max_size=7),  # a header cut short
)


@settings(max_examples=50)
@given(chunks=st.lists(frames, min_size=1, max_size=5), as_type=unions)
def test_framed_stream_over_a_socketpair_gives_only_wire_errors(
    chunks: list[bytes], as_type: Any
) -> None:
    async def main() -> None:
        left, right = trio.socket.socketpair()
        sender = trio.SocketStream(left)
        receiver = wire.FramedStream(trio.SocketStream(right), MAX_TEST_FRAME)

        async def send() -> None:
            async with sender:
                for chunk in chunks:
                    await sender.send_all(chunk)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            with trio.fail_after(10):
                while True:
                    try:
                        await receiver.receive_message(as_type)
                    except (trio.EndOfChannel, WireError):
                        break  # a clean end, or a protocol error: the stream is done
            nursery.cancel_scope.cancel()
        await receiver.aclose()

    trio.run(main)


async def test_an_oversize_header_is_refused_before_any_body_arrives() -> None:
    left, right = trio.socket.socketpair()
    async with trio.SocketStream(left) as sender:
        receiver = wire.FramedStream(trio.SocketStream(right), MAX_TEST_FRAME)
        await sender.send_all(struct.pack(">I", 2**32 - 1))
        with trio.fail_after(5), pytest.raises(FrameTooLarge):
            await receiver.receive_message(ipc.ToRunner)
        await receiver.aclose()
