"""A real `trexo run` node's peer port under hostile clients on 127.0.0.1: hostile messages
before and after a handshake, upgrades on other paths, invalid websocket frames. The node
stays up, answers `/health`, and logs what it refused or dropped."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio
from hostile_json import nest
from raw_websocket import INVALID_FRAMES, RawWebSocket
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    WebSocketConnection,
    open_websocket,
)

from tests.waiting import wait_until
from trexo.config import MAX_JSON_DEPTH, PROTOCOL_VERSION
from trexo.net import handshake as hs
from trexo.net.handshake_io import dial_handshake
from trexo.net.link import CLOSE_REFUSED
from trexo.net.transport import RESOURCE
from trexo.types.ids import NodeId

from .cluster import free_port
from .harness import TrexoProcess, run_trexo

STEP_TIMEOUT_S = 15.0
"""Bound on each exchange with the node: generous, it catches hangs only."""
PROMPT_CLOSE_S = 2.0
"""An invalid frame must end the connection well before the node's 5 s handshake timeout."""
TOO_DEEP = f"nested deeper than {MAX_JSON_DEPTH}"
HOSTILE = {
    "deep-2KB": nest(1_000),  # the message that killed a node (exit 1)
    "deep-1MB": nest(512 * 1024),
    "deep-unclosed": nest(100_000, '{"a":', closed=False),
    "huge-int": "9" * 100_000,
    "huge-float": '{"type": "Hello", "version": 1e999999}',
    "nan": '{"type": "Hello", "version": NaN}',
    "surrogate": '{"type": "Hello", "node_id": "\\ud800"}',
    "unhashable-tag": '{"type": ["Hello"]}',
}
BROKEN_PROTOCOL = {1002, 1007, None}
"""A close frame saying protocol error or invalid payload, or none (lost to the reset);
never 4002 or 4003, which a heartbeat or handshake timeout would send."""


@asynccontextmanager
async def node_with_peer_port(tmp_path: Path) -> AsyncIterator[tuple[TrexoProcess, int]]:
    port = free_port()
    async with run_trexo(tmp_path / "node", "--no-model", "--peer-port", str(port)) as node:
        yield node, port


async def assert_healthy(node: TrexoProcess) -> None:
    assert node.process.returncode is None, node.log_text()[-3000:]
    async with httpx.AsyncClient(timeout=STEP_TIMEOUT_S) as http:
        response = await http.get(f"{node.url}/health")
    assert response.status_code == 200, response.text


async def wait_logged(node: TrexoProcess, *fragments: str) -> None:
    """Until one line of the node's log has every one of `fragments`; the node must live."""

    def logged() -> bool:
        log = node.log_text()
        if any(all(f in line for f in fragments) for line in log.splitlines()):
            return True
        assert node.process.returncode is None, log[-3000:]
        return False

    await wait_until(logged, timeout=STEP_TIMEOUT_S, what=f"a log line with {fragments}")


def identity(name: str) -> hs.Identity:
    return hs.Identity(NodeId(name), "trexo", PROTOCOL_VERSION, 1)


def envelope(sender: str, topic: str, payload_json: str) -> str:
    return f'{{"topic":{json.dumps(topic)},"sender":{json.dumps(sender)},"payload":{payload_json}}}'


async def drain(ws: WebSocketConnection) -> None:
    """Read what the node sends (election, gossip): a full queue would stall our pongs."""
    try:
        while True:
            await ws.get_message()
    except ConnectionClosed:
        pass


async def test_hostile_first_messages_are_refused_and_the_node_lives(tmp_path: Path) -> None:
    async with node_with_peer_port(tmp_path) as (node, port):
        for name, text in HOSTILE.items():
            with trio.fail_after(STEP_TIMEOUT_S):
                async with open_websocket("127.0.0.1", port, RESOURCE, use_ssl=False) as ws:
                    await ws.send_message(text)
                    refusal = json.loads(await ws.get_message())
                    assert refusal["type"] == "Refuse", name
                    assert refusal["code"] == hs.PROTOCOL, name
                    with pytest.raises(ConnectionClosed) as closed:
                        await ws.get_message()
                    assert closed.value.reason.code == CLOSE_REFUSED, name
        await wait_logged(node, "refused peer 127.0.0.1", "handshake message is", TOO_DEEP)
        await wait_logged(node, "refused peer 127.0.0.1", "lone surrogate")
        await assert_healthy(node)


async def test_hostile_messages_after_a_handshake_are_dropped(tmp_path: Path) -> None:
    me = "zz-hostile"  # larger than any node id: the node dials the peers we gossip
    bad_gossip = {
        "peers": [
            {"node_id": "zzzz1", "host": "h" * 100, "port": 1},  # IDNA cannot encode it
            {"node_id": "zzzz2", "host": "127.0.0.1", "port": 10**19},  # past a C long
        ]
    }
    messages = [
        *HOSTILE.values(),
        envelope(me, "stream", nest(1_000)),
        envelope(me, "election", '{"type": {"x": 1}}'),
        envelope(me, "commands", '{"type": "Cancel", "request_id": 1e999}'),
        envelope(me, "peers", json.dumps(bad_gossip)),
    ]
    async with node_with_peer_port(tmp_path) as (node, port):
        with trio.fail_after(STEP_TIMEOUT_S):
            async with (
                open_websocket("127.0.0.1", port, RESOURCE, use_ssl=False) as ws,
                trio.open_nursery() as nursery,
            ):
                agreed = await dial_handshake(ws, identity(me), ())
                nursery.start_soon(drain, ws)
                for text in messages:  # sealed as a peer seals them: the link opens each
                    await ws.send_message(agreed.channel.sealer.seal(text.encode()))
                await wait_logged(node, f"dropped a message from peer {me}", TOO_DEEP)
                await wait_logged(node, f"dropped a message from peer {me}", "out of range")
                await wait_logged(node, "could not link to discovered peer zzzz1")
                await wait_logged(node, "could not link to discovered peer zzzz2")
                await ws.ping()  # the link is still up: fewer than the garbage limit
                assert ws.closed is None
                nursery.cancel_scope.cancel()
        await assert_healthy(node)


async def test_an_upgrade_on_another_path_is_refused(tmp_path: Path) -> None:
    async with node_with_peer_port(tmp_path) as (node, port):
        for path in ["/", "/ws", f"{RESOURCE}/x", f"{RESOURCE}?a=1"]:
            with trio.fail_after(STEP_TIMEOUT_S), pytest.raises(ConnectionRejected) as info:
                async with open_websocket("127.0.0.1", port, path, use_ssl=False):
                    pass
            assert info.value.status_code == 404, path
        await wait_logged(node, "refused a websocket upgrade from 127.0.0.1", "'/ws'")
        with trio.fail_after(STEP_TIMEOUT_S):
            async with open_websocket("127.0.0.1", port, RESOURCE, use_ssl=False) as ws:
                await dial_handshake(ws, identity("right-path"), ())
        await assert_healthy(node)


@pytest.mark.parametrize("after_handshake", [False, True], ids=["before", "after"])
async def test_invalid_frames_close_the_connection_promptly(
    tmp_path: Path, after_handshake: bool
) -> None:
    async with node_with_peer_port(tmp_path) as (node, port):
        for name, data in INVALID_FRAMES.items():
            with trio.fail_after(STEP_TIMEOUT_S):
                raw = await RawWebSocket.connect(port)
                try:
                    assert await raw.upgrade() == 101
                    if after_handshake:
                        await raw.handshake(f"raw-{name}")
                    await raw.send_raw(data)
                    with trio.fail_after(PROMPT_CLOSE_S):
                        code = await raw.close_code()
                    assert code in BROKEN_PROTOCOL, name
                finally:
                    await raw.aclose()
        await assert_healthy(node)
