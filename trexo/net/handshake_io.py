"""Drives the handshake of `trexo.net.handshake` over a websocket (the thin I/O side).

Both drivers return an `Agreement` (both hellos, and the link's `SecureChannel` as this side
holds it) once the link is agreed, or raise
`PeerRefused` (`by_peer` says which side refused; a refusal of ours has been sent to the
peer) or `DialFailed` (the connection broke, or the peer spoke out of turn). Timeouts are
the caller's: it bounds the whole handshake.
"""

from __future__ import annotations

from contextlib import suppress
from typing import NoReturn, TypeVar

import attrs
from trio_websocket import ConnectionClosed, WebSocketConnection

from trexo import safe_json, wire
from trexo.errors import DialFailed, PeerRefused, WireError
from trexo.net import handshake as hs
from trexo.net.gossip import PeerInfo
from trexo.net.secure_channel import EphemeralKey, SecureChannel
from trexo.safe_json import bounded

M = TypeVar("M", hs.Hello, hs.Proof, hs.Ready)


@attrs.frozen
class Agreement:
    """A handshake's outcome, as one side sees it."""

    ours: hs.Hello
    theirs: hs.Hello
    channel: SecureChannel
    """Seals what this side sends on the link and opens what it receives."""


async def dial_handshake(
    ws: WebSocketConnection, me: hs.Identity, peers: tuple[PeerInfo, ...]
) -> Agreement:
    """The dialler's side."""
    key = EphemeralKey()
    ours = me.hello(peers, key)
    await _send(ws, ours)
    theirs = await _receive(ws, hs.Hello, me)
    refusal = hs.check_hello(me, theirs) or hs.check_proof(
        me.secret, hs.ACCEPTOR, ours, theirs, theirs.proof
    )
    if refusal is not None:
        await _refuse(ws, refusal)
    keys = hs.link_keys(me.secret, key, ours, theirs, role=hs.DIALER)
    if isinstance(keys, hs.Refusal):
        await _refuse(ws, keys)
    await _send(ws, hs.Proof(hs.make_proof(me.secret, hs.DIALER, ours, theirs)))
    await _receive(ws, hs.Ready, me)
    return Agreement(ours, theirs, SecureChannel.for_dialer(keys))


async def accept_handshake(
    ws: WebSocketConnection, me: hs.Identity, peers: tuple[PeerInfo, ...]
) -> Agreement:
    """The acceptor's side."""
    theirs = await _receive(ws, hs.Hello, me)
    refusal = hs.check_hello(me, theirs)
    if refusal is not None:
        await _refuse(ws, refusal)
    key = EphemeralKey()
    ours = me.hello(peers, key)
    # The transcript covers ids, nonces and keys, not the proof, so the hello can sign itself.
    ours = attrs.evolve(ours, proof=hs.make_proof(me.secret, hs.ACCEPTOR, theirs, ours))
    keys = hs.link_keys(me.secret, key, theirs, ours, role=hs.ACCEPTOR)
    if isinstance(keys, hs.Refusal):
        await _refuse(ws, keys)
    await _send(ws, ours)
    proof = await _receive(ws, hs.Proof, me)
    refusal = hs.check_proof(me.secret, hs.DIALER, theirs, ours, proof.proof)
    if refusal is not None:
        await _refuse(ws, refusal)
    await _send(ws, hs.Ready())
    return Agreement(ours, theirs, SecureChannel.for_acceptor(keys))


async def _send(ws: WebSocketConnection, message: hs.HandshakeMessage) -> None:
    try:
        await ws.send_message(wire.to_json(message, hs.HandshakeMessage).decode())
    except ConnectionClosed as exc:
        raise DialFailed(f"connection closed during the handshake ({_why(exc)})") from None


async def _receive(ws: WebSocketConnection, expected: type[M], me: hs.Identity) -> M:
    """The next handshake message, which must be an `expected` (or a refusal)."""
    try:
        text = await ws.get_message()
    except ConnectionClosed as exc:
        raise DialFailed(f"connection closed during the handshake ({_why(exc)})") from None
    if not isinstance(text, str):
        await _refuse(ws, hs.Refusal(hs.PROTOCOL, "binary message during the handshake"))
    try:
        raw = safe_json.loads(text)
    except WireError as exc:
        await _refuse(ws, hs.Refusal(hs.PROTOCOL, f"handshake message is {exc}"))
    refusal = hs.check_version(raw, me.version)
    if refusal is not None:
        await _refuse(ws, refusal)
    try:
        message = wire.structure(raw, hs.HandshakeMessage)
    except WireError as exc:
        await _refuse(ws, hs.Refusal(hs.PROTOCOL, f"bad handshake message: {exc}"))
    if isinstance(message, hs.Refuse):
        raise PeerRefused(bounded(message.reason), bounded(message.code), by_peer=True)
    if not isinstance(message, expected):
        got = type(message).__name__
        await _refuse(ws, hs.Refusal(hs.PROTOCOL, f"expected {expected.__name__}, got {got}"))
    return message


async def _refuse(ws: WebSocketConnection, refusal: hs.Refusal) -> NoReturn:
    """Tell the peer why, then raise; the caller closes the connection."""
    # A reason may quote what the peer sent (its version, say): keep it short.
    refusal = attrs.evolve(refusal, reason=bounded(refusal.reason))
    with suppress(ConnectionClosed):  # if it left already, the refusal is still ours to log
        await ws.send_message(wire.to_json(refusal.message(), hs.HandshakeMessage).decode())
    raise PeerRefused(refusal.reason, refusal.code, by_peer=False)


def _why(exc: ConnectionClosed) -> str:
    reason = exc.reason
    if reason is None:
        return "no close reason"
    return f"code {reason.code}" + (f": {reason.reason}" if reason.reason else "")
