"""A real `trexo run` node's peer port under hostile clients on 127.0.0.1: hostile messages
before and after a handshake, upgrades on other paths, invalid websocket frames. The node
stays up, answers `/health`, and logs what it refused or dropped."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
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

from tests.waiting import holds_for, wait_until
from trexo import wire
from trexo.config import MAX_JSON_DEPTH, PEER_HANDSHAKE_MESSAGE_BYTES, PROTOCOL_VERSION
from trexo.net import handshake as hs
from trexo.net.handshake_io import dial_handshake
from trexo.net.link import CLOSE_REFUSED
from trexo.net.secure_channel import EphemeralKey
from trexo.net.transport import RESOURCE
from trexo.types.ids import NodeId

from .cluster import open_cluster
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
MESSAGE_TOO_BIG = 1009
BROKEN_PROTOCOL = {1002, 1007, None}
"""A close frame saying protocol error or invalid payload, or none (lost to the reset);
never 4002 or 4003, which a heartbeat or handshake timeout would send."""


@asynccontextmanager
async def node_with_peer_port(tmp_path: Path) -> AsyncIterator[tuple[TrexoProcess, int]]:
    async with run_trexo(tmp_path / "node", "--no-model") as node:
        yield node, node.peer_port()


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
                    if len(text.encode()) > PEER_HANDSHAKE_MESSAGE_BYTES:
                        # Larger than any hello: closed unread, before any decoding.
                        with pytest.raises(ConnectionClosed) as closed:
                            await ws.send_message(text)
                            await ws.get_message()
                        assert closed.value.reason.code == MESSAGE_TOO_BIG, name
                        continue
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
            {"node_id": "zzzz1", "host": "h" * 100, "port": 1},  # a name (IDNA cannot encode)
            {"node_id": "zzzz2", "host": "127.0.0.1", "port": 10**19},  # past any port
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
                # No peer's address: ignored, never dialled (let alone looked up).
                await wait_logged(node, "ignored a gossiped address of node zzzz1", "not an IP")
                await wait_logged(node, "ignored a gossiped address of node zzzz2", "port")
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


# --- a flood of handshakes (no secret needed) ----------------------------------------------

FLOOD_S = 8.0
"""How long the flood runs: several times the heartbeats' bound on a silent peer (1.2 s),
and past the handshake timeout (5 s), so that held connections are closed and come again."""
BIG_HELLO_PEERS = 150_000
"""A hello listing this many peers is ~10 MB: decoding one holds an event loop ~0.5 s."""
HELD_CONNECTIONS = 300
"""Connections that each send a small hello and then nothing: past the node's caps."""


def small_hello(name: str) -> str:
    message = identity(name).hello((), EphemeralKey())
    return wire.to_json(message, hs.HandshakeMessage).decode()


def big_hello(name: str) -> str:
    """A hello right in every field but its size: a peer list no node sends."""
    raw = json.loads(small_hello(name))
    peers = [
        {"node_id": f"z{k:031d}", "host": "127.0.0.1", "port": 1} for k in range(BIG_HELLO_PEERS)
    ]
    return json.dumps({**raw, "peers": peers})


async def flood_handshakes(port: int, until: float, tried: dict[str, int]) -> None:
    """Until `until`, connection after connection: four at a time sending a big hello, and
    many sending a small one and then nothing (the node answers it and waits in vain for the
    proof). `tried` counts the connections each kind tried."""
    hello = big_hello("zz-big")
    broken = (OSError, ConnectionClosed, ConnectionRejected, trio.TooSlowError)

    async def connect_and_send(kind: str, text: str) -> None:
        tried[kind] += 1
        with suppress(*broken), trio.move_on_at(until), trio.fail_after(STEP_TIMEOUT_S):
            async with open_websocket("127.0.0.1", port, RESOURCE, use_ssl=False) as ws:
                await ws.send_message(text)
                while True:
                    await ws.get_message()

    async def again_and_again(kind: str, text: str) -> None:
        while trio.current_time() < until:
            await connect_and_send(kind, text)

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(again_and_again, "big", hello)
        for k in range(HELD_CONNECTIONS):
            nursery.start_soon(again_and_again, "small", small_hello(f"zz-{k}"))


async def test_a_handshake_flood_on_the_masters_peer_port_costs_no_election(
    tmp_path: Path,
) -> None:
    async with open_cluster(tmp_path) as cluster:
        await cluster.add_many(2, "--no-model")
        session = await cluster.wait_converged(expect_nodes=2)
        master = cluster.by_id(session["master_id"])
        follower = next(n for n in cluster.nodes if n is not master)
        tried = {"big": 0, "small": 0}

        async def session_kept() -> bool:
            for node in cluster.nodes:
                health = await cluster.health(node)
                assert health is not None, f"{node.name} does not answer"
                assert health["session"] == session, (node.name, health["session"], session)
            # A command through the other node: the master decides it (here, a 404).
            response = await cluster.http.delete(f"{follower.url}/instances/nonexistent")
            assert response.status_code == 404, response.text
            return True

        async with trio.open_nursery() as nursery:
            until = trio.current_time() + FLOOD_S
            nursery.start_soon(flood_handshakes, master.peer_port, until, tried)
            await holds_for(session_kept, seconds=FLOOD_S, what="the session through the flood")
        assert tried["big"] >= 4 and tried["small"] >= HELD_CONNECTIONS, tried
        assert master.process is not None
        await wait_logged(master.process, "refusing peer connections")
        assert await cluster.wait_converged(expect_nodes=2) == session
