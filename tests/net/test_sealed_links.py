"""Peer links are encrypted: what crosses the wire, and what a link does with a message that
was tampered with, replayed, or not sealed at all (in-process nodes, a relay between them)."""

from __future__ import annotations

import logging
import secrets

import pytest
import trio
from wire_relay import OPCODE_BINARY, WireRelay

from tests.waiting import wait_until
from trexo.config import DiscoveryConfig
from trexo.net.link import CLOSE_TAMPERED
from trexo.net.topics import Topic
from trexo.types.ids import RequestId
from trexo.types.stream import StreamFailed

from .helpers import TEST_TIMEOUT_S, Node, fake_peer, logged, start_node, wait_peers

LOG = "trexo.net"
SECRETS = [None, b"s3cret"]
SECRET_IDS = ["no secret", "secret"]
GOSSIP_MESSAGES = 2
"""What a new link between two nodes carries first: one peer list each way."""


def marked(marker: str) -> StreamFailed:
    return StreamFailed(RequestId("r1"), f"the prompt was {marker}")


class CountingRelay(WireRelay):
    """A `WireRelay` that counts the sealed (binary) messages it has carried."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.sealed = 0

    def alter(self, frame: bytes) -> list[bytes]:
        if frame[0] & 0x0F == OPCODE_BINARY:
            self.sealed += 1
        return super().alter(frame)


async def linked_through_relay(
    nursery: trio.Nursery, secret: bytes | None
) -> tuple[Node, Node, CountingRelay]:
    """Nodes a and b, b dialling a through a relay (and re-dialling it when the link is lost),
    once the link's first messages have passed: the relay's next sealed message is the test's."""
    a = await start_node(nursery, "a", secret=secret)
    relay = CountingRelay(a.port)
    await nursery.start(relay.run)
    redial = DiscoveryConfig(
        static_peers=(("127.0.0.1", relay.port),),
        multicast=False,
        redial_initial=0.05,
        redial_max=0.2,
    )
    b = await start_node(nursery, "b", secret=secret, discovery=redial)
    await wait_peers(a.router, ["b"])
    await wait_peers(b.router, ["a"])
    await wait_until(
        lambda: relay.sealed >= GOSSIP_MESSAGES, timeout=5.0, what="the new link's gossip relayed"
    )
    return a, b, relay


async def exchange(sender: Node, receiver: Node, payload: StreamFailed) -> None:
    with receiver.router.subscribe(Topic.STREAM) as inbox:
        await sender.router.send(receiver.name, Topic.STREAM, payload)
        with trio.fail_after(2):
            assert (await inbox.receive()).payload == payload


@pytest.mark.parametrize("secret", SECRETS, ids=SECRET_IDS)
async def test_no_message_crosses_the_wire_in_clear_text(secret: bytes | None) -> None:
    marker = f"MARKER-{secrets.token_hex(8)}"
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a, b, relay = await linked_through_relay(nursery, secret)
            before = len(relay.recorded)
            await exchange(a, b, marked(marker))
            await exchange(b, a, marked(marker))
            assert len(relay.recorded) - before > 2 * len(marker)  # the relay saw both
            assert b'"type":"Hello"' in relay.recorded  # it records what passes in clear
            assert marker.encode() not in relay.recorded
            assert b"StreamFailed" not in relay.recorded
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("secret", SECRETS, ids=SECRET_IDS)
@pytest.mark.parametrize("attack", ["tamper", "replay"])
async def test_a_tampered_or_replayed_message_closes_the_link_and_the_nodes_link_again(
    attack: str, secret: bytes | None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a, b, relay = await linked_through_relay(nursery, secret)
            with b.router.subscribe(Topic.STREAM) as inbox:
                sent = marked(attack)
                if attack == "tamper":
                    relay.tamper_next()
                else:
                    relay.replay_next()  # the message, then the same bytes again
                await a.router.send(b.name, Topic.STREAM, sent)
                if attack == "replay":
                    with trio.fail_after(2):
                        assert (await inbox.receive()).payload == sent  # the original
                await wait_peers(b.router, [])
                # Nothing else accepted. b detaches a link once its reader has returned: what
                # the link was to deliver, it has.
                assert inbox.statistics().current_buffer_used == 0
            assert (relay.tampered, relay.replayed) == ((1, 0) if attack == "tamper" else (0, 1))
            assert logged(caplog, "closing the link to peer a", "failed authentication")
            await wait_peers(a.router, ["b"])  # b dialled a again: a new link, new keys
            await wait_peers(b.router, ["a"])
            assert relay.connections == 2
            await exchange(a, b, marked("after"))
            nursery.cancel_scope.cancel()


async def test_an_unsealed_message_closes_the_link() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, "a")
            async with fake_peer(a, "plain") as peer:
                await wait_peers(a.router, ["plain"])
                await peer.ws.send_message('{"topic": "stream", "sender": "plain"}')
                await wait_peers(a.router, [])
                with trio.fail_after(2), pytest.raises(Exception, match=str(CLOSE_TAMPERED)):
                    while True:
                        await peer.ws.get_message()
            nursery.cancel_scope.cancel()
