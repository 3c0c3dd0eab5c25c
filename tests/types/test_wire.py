"""Wire types round-trip through JSON and frames; bad input is refused with a typed error."""

from __future__ import annotations

import struct
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from trexo import wire
from trexo.errors import FrameTooLarge, MalformedMessage, TruncatedFrame
from trexo.types import ipc
from trexo.types.chunks import Chunk, Usage
from trexo.types.generation import ChatMessage, GenerationRequest, SamplingParams
from trexo.types.runner_status import (
    RunnerFailed,
    RunnerIdle,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerStopped,
)
from trexo.types.shard import ShardSpec
from trexo.types.state import NodeInfo

text = st.text(max_size=40)
ids = st.text(alphabet="0123456789abcdef", min_size=1, max_size=32)
floats = st.floats(allow_nan=False, allow_infinity=False, width=64)
small_ints = st.integers(min_value=0, max_value=2**31)

sampling = st.builds(
    SamplingParams,
    max_tokens=small_ints,
    temperature=floats,
    top_p=floats,
    top_k=small_ints,
    min_p=floats,
    seed=st.none() | small_ints,
    repetition_penalty=st.none() | floats,
    stop=st.lists(text, max_size=4).map(tuple),
)
messages = st.lists(st.builds(ChatMessage, role=text, content=text), max_size=4).map(tuple)
requests = st.one_of(
    st.builds(GenerationRequest, request_id=ids, messages=messages, params=sampling),
    st.builds(GenerationRequest, request_id=ids, prompt=text, params=sampling),
)
shards = st.builds(
    ShardSpec,
    start_layer=st.none() | small_ints,
    end_layer=st.none() | small_ints,
    rank=small_ints,
    world_size=small_ints,
)
usage = st.builds(Usage, prompt_tokens=small_ints, completion_tokens=small_ints)
chunks = st.builds(
    Chunk,
    request_id=ids,
    text=text,
    token_ids=st.lists(small_ints, max_size=8).map(tuple),
    finish_reason=st.sampled_from([None, "stop", "length", "cancelled", "error"]),
    usage=st.none() | usage,
)
statuses = st.one_of(
    st.just(RunnerIdle()),
    st.builds(RunnerLoading, progress=floats),
    st.just(RunnerReady()),
    st.builds(RunnerRunning, active_requests=small_ints),
    st.builds(RunnerFailed, cause=text),
    st.builds(RunnerStopped, cause=text),
)
to_runner = st.one_of(
    st.builds(ipc.LoadModel, model_dir=text, shard=shards),
    st.builds(ipc.Generate, request=requests),
    st.builds(ipc.Cancel, request_id=ids),
    st.just(ipc.Shutdown()),
)
from_runner = st.one_of(
    st.builds(ipc.StatusReport, status=statuses),
    st.builds(ipc.ChunkMessage, chunk=chunks),
    st.builds(ipc.RequestFailed, request_id=ids, message=text),
)


@given(to_runner)
def test_every_parent_message_round_trips(msg: ipc.ToRunner) -> None:
    assert wire.from_json(wire.to_json(msg, ipc.ToRunner), ipc.ToRunner) == msg


@given(from_runner)
def test_every_runner_message_round_trips(msg: ipc.FromRunner) -> None:
    assert wire.from_json(wire.to_json(msg, ipc.FromRunner), ipc.FromRunner) == msg


def test_union_members_carry_their_tag() -> None:
    assert b'"type":"Shutdown"' in wire.to_json(ipc.Shutdown(), ipc.ToRunner)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"type": "Explode"}', "'type' is 'Explode'"),
        (b'{"request_id": "x"}', "'type' is None"),
        (b'{"type": "Cancel"}', "required field missing @ message.request_id"),
        (b'{"type": "Cancel", "request_id": 7}', "expected str, got int @ message.request_id"),
        (b'{"type": "Shutdown", "extra": 1}', "extra"),
        (
            b'{"type": "Generate", "request": {"request_id": "r", "prompt": "p",'
            b' "params": {"max_tokens": "9"}}}',
            "expected int, got str @ message.request.params.max_tokens",
        ),
        (b'{"type": "Generate", "request": {"request_id": "r"}}', "exactly one of"),
    ],
)
def test_malformed_messages_are_refused_with_a_clear_error(body: bytes, says: str) -> None:
    with pytest.raises(MalformedMessage, match=r"invalid ToRunner|not valid JSON") as info:
        wire.from_json(body, ipc.ToRunner)
    assert says in str(info.value)


def test_booleans_are_not_integers() -> None:
    body = b'{"type": "StatusReport", "status": {"type": "RunnerRunning", "active_requests": true}}'
    with pytest.raises(MalformedMessage, match="expected int, got bool"):
        wire.from_json(body, ipc.FromRunner)


# --- frames ------------------------------------------------------------------------------


def framed_pair(max_frame_bytes: int = 1024) -> tuple[wire.FramedStream, wire.FramedStream]:
    left, right = trio.testing.memory_stream_pair()
    return wire.FramedStream(left, max_frame_bytes), wire.FramedStream(right, max_frame_bytes)


@given(st.lists(to_runner, min_size=1, max_size=5))
def test_messages_cross_a_framed_stream_in_order(msgs: list[ipc.ToRunner]) -> None:
    async def main() -> None:
        sender, receiver = framed_pair(max_frame_bytes=1 << 20)
        for msg in msgs:
            await sender.send_message(msg, ipc.ToRunner)
        got = [await receiver.receive_message(ipc.ToRunner) for _ in msgs]
        assert got == msgs

    trio.run(main)


async def test_clean_eof_between_frames_ends_the_channel() -> None:
    sender, receiver = framed_pair()
    await sender.send_frame(b"{}")
    await sender.stream.send_eof()  # type: ignore[attr-defined]
    assert await receiver.receive_frame() == b"{}"
    with pytest.raises(trio.EndOfChannel):
        await receiver.receive_frame()


@pytest.mark.parametrize("raw", [b"\x00\x00", b"\x00\x00\x00\x05ab"])
async def test_eof_inside_a_frame_is_a_truncated_frame(raw: bytes) -> None:
    sender, receiver = framed_pair()
    await sender.stream.send_all(raw)
    await sender.stream.send_eof()  # type: ignore[attr-defined]
    with pytest.raises(TruncatedFrame, match="stream ended after"):
        await receiver.receive_frame()


async def test_oversize_header_is_refused_before_reading_the_body() -> None:
    sender, receiver = framed_pair(max_frame_bytes=100)
    await sender.stream.send_all(struct.pack(">I", 101))
    with pytest.raises(FrameTooLarge, match="announces 101 bytes, limit 100"):
        await receiver.receive_frame()


async def test_oversize_message_is_refused_by_the_sender() -> None:
    sender, _ = framed_pair(max_frame_bytes=10)
    with pytest.raises(FrameTooLarge, match="exceeds 10"):
        await sender.send_message(ipc.Cancel("x" * 20), ipc.ToRunner)


async def test_frames_split_across_many_small_reads() -> None:
    sender, receiver = framed_pair()
    body = wire.to_json(ipc.Cancel("abc"), ipc.ToRunner)
    frame = wire.encode_frame(body)
    for i in range(len(frame)):
        await sender.stream.send_all(frame[i : i + 1])
    got: Any = await receiver.receive_message(ipc.ToRunner)
    assert got == ipc.Cancel("abc")


def node_report(api_url: object) -> dict[str, Any]:
    return {
        "node_id": "n1",
        "hostname": "h",
        "memory_total": 1,
        "memory_available": 1,
        "api_url": api_url,
    }


@pytest.mark.parametrize(
    "api_url", ["http://10.0.0.7:52415", "https://node.lan", "http://[fd00::1]:8000", None]
)
def test_a_node_reports_its_api_as_an_http_url(api_url: str | None) -> None:
    assert wire.structure(node_report(api_url), NodeInfo).api_url == api_url


@pytest.mark.parametrize(
    "api_url",
    [
        "javascript:alert(1)",
        "not a url",
        "ftp://files.example/",
        "http://",
        "//host:1",
        "http://h:1/\nx",
        "data:text/html,<b>",
        "",
    ],
)
def test_an_api_url_that_is_no_http_url_is_refused(api_url: str) -> None:
    """The dashboard links each node's address: a peer's report cannot make it a script."""
    with pytest.raises(MalformedMessage, match="api_url"):
        wire.structure(node_report(api_url), NodeInfo)
