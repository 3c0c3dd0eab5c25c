"""The peer handshake's messages and checks (pure logic; `handshake_io` drives it).

    dialler                                   acceptor
       Hello(id, namespace, version, port, nonce_d, key_d, peers)  ->
                                              checks it; Refuse, or
       <-  Hello(id, namespace, version, port, nonce_a, key_a, peers, proof_a)
    checks it and proof_a; Refuse, or
       Proof(proof_d)  ->
                                              checks proof_d; Refuse, or
       <-  Ready
    from here on every message is sealed (`secure_channel`), both ways

`key_d` and `key_a` are fresh X25519 public keys: both sides derive the link's keys from the
exchange, the transcript (both ids, nonces and keys) and the cluster secret, if any
(`link_keys`). With a secret, each side also proves it knows the secret by an HMAC over the
transcript, labelled with its role so a proof cannot be reflected back; the secret itself
never crosses the wire. Since the transcript holds the public keys, a man in the middle who
swaps them fails the proofs. The hellos themselves are in clear text (ids, namespace, ports,
the sender's linked peers, nonces and public keys: nothing of what the cluster serves). A
refusal is sent to the other side (who logs it too) before the connection closes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any

import attrs

from trexo import wire
from trexo.net.gossip import PeerInfo
from trexo.net.secure_channel import (
    PUBLIC_KEY_BYTES,
    DirectionKeys,
    EphemeralKey,
    KeyExchangeFailed,
    derive_keys,
)
from trexo.types.ids import NodeId

NONCE_BYTES = 16

# Refusal codes: machine-readable, so a dialler can tell a permanent refusal from a passing one.
VERSION = "version"
NAMESPACE = "namespace"
SELF_LINK = "self"
AUTH = "auth"
PROTOCOL = "protocol"

DIALER = "dialer"
ACCEPTOR = "acceptor"


@attrs.frozen
class Hello:
    node_id: NodeId
    namespace: str
    version: int
    port: int
    """The sender's advertised peer port."""
    nonce: str
    key: str
    """The sender's ephemeral X25519 public key (hex) for this handshake only."""
    authenticated: bool
    """The sender has a cluster secret (and will demand proof of it)."""
    peers: tuple[PeerInfo, ...] = ()
    proof: str | None = None
    """Only in the acceptor's hello: its proof of the secret (None without one)."""


@attrs.frozen
class Proof:
    """The dialler's proof of the secret (None without one)."""

    proof: str | None


@attrs.frozen
class Ready:
    """The acceptor accepts the link: from here on the connection carries envelopes."""


@attrs.frozen
class Refuse:
    code: str
    reason: str


HandshakeMessage = Hello | Proof | Ready | Refuse
wire.register_union(HandshakeMessage, "HandshakeMessage")


@attrs.frozen
class Refusal:
    """Why a side refuses the link; `code` is one of the refusal codes above."""

    code: str
    reason: str

    def message(self) -> Refuse:
        return Refuse(self.code, self.reason)


@attrs.frozen
class Identity:
    """What this node expects of a peer, and presents about itself."""

    node_id: NodeId
    namespace: str
    version: int
    port: int
    secret: bytes | None = attrs.field(default=None, repr=False)

    def hello(
        self, peers: tuple[PeerInfo, ...], key: EphemeralKey, proof: str | None = None
    ) -> Hello:
        """A hello with a fresh nonce, presenting `key`'s public half."""
        return Hello(
            node_id=self.node_id,
            namespace=self.namespace,
            version=self.version,
            port=self.port,
            nonce=new_nonce(),
            key=key.public.hex(),
            authenticated=self.secret is not None,
            peers=peers,
            proof=proof,
        )


def new_nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def check_version(raw: Any, ours: int) -> Refusal | None:
    """Refuse a hello of another protocol version before decoding the rest of it (whose
    fields may differ between versions)."""
    if isinstance(raw, dict) and raw.get("type") == "Hello":
        theirs = raw.get("version")
        if theirs != ours:
            return Refusal(VERSION, f"protocol version {theirs!r} != {ours!r}")
    return None


def check_hello(me: Identity, hello: Hello) -> Refusal | None:
    """Whether `hello` from a peer is acceptable to `me` (proofs are checked separately)."""
    if hello.version != me.version:
        return Refusal(VERSION, f"protocol version {hello.version!r} != {me.version!r}")
    if hello.namespace != me.namespace:
        return Refusal(NAMESPACE, f"namespace {hello.namespace!r} != {me.namespace!r}")
    if public_key(hello) is None:
        return Refusal(PROTOCOL, f"hello's key is not a {PUBLIC_KEY_BYTES}-byte public key in hex")
    if hello.node_id == me.node_id:
        return Refusal(SELF_LINK, f"node id {hello.node_id} is this node's own (self-link)")
    if me.secret is not None and not hello.authenticated:
        return Refusal(AUTH, "peer has no cluster secret, this node requires one")
    if me.secret is None and hello.authenticated:
        return Refusal(AUTH, "peer requires a cluster secret, this node has none")
    return None


def public_key(hello: Hello) -> bytes | None:
    """The hello's public key as bytes, or None if it is not one."""
    try:
        key = bytes.fromhex(hello.key)
    except ValueError:
        return None
    return key if len(key) == PUBLIC_KEY_BYTES else None


def transcript(dialer: Hello, acceptor: Hello) -> bytes:
    """What both proofs and the link's keys cover: the namespace, both ids, both nonces and
    both public keys (JSON: unambiguous)."""
    fields = [
        dialer.namespace,
        dialer.node_id,
        dialer.nonce,
        dialer.key,
        acceptor.node_id,
        acceptor.nonce,
        acceptor.key,
    ]
    return json.dumps(fields).encode()


def link_keys(
    secret: bytes | None, ours: EphemeralKey, dialer: Hello, acceptor: Hello, *, role: str
) -> DirectionKeys | Refusal:
    """The link's keys as `role` (whose own hello presented `ours`) derives them, or a
    refusal if the peer's key gives no shared secret."""
    theirs = acceptor if role == DIALER else dialer
    peer_key = public_key(theirs)
    if peer_key is None:
        return Refusal(PROTOCOL, "hello's key is not a public key")
    try:
        shared = ours.exchange(peer_key)
    except KeyExchangeFailed as exc:
        return Refusal(PROTOCOL, f"key exchange failed: {exc}")
    return derive_keys(shared, transcript(dialer, acceptor), secret)


def make_proof(secret: bytes | None, role: str, dialer: Hello, acceptor: Hello) -> str | None:
    """`role`'s proof that it knows `secret` (None without a secret)."""
    if secret is None:
        return None
    message = role.encode() + b"\0" + transcript(dialer, acceptor)
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def check_proof(
    secret: bytes | None, role: str, dialer: Hello, acceptor: Hello, proof: str | None
) -> Refusal | None:
    """Whether `proof`, sent by `role`, shows that it knows our `secret` (constant time)."""
    expected = make_proof(secret, role, dialer, acceptor)
    if expected is None:
        return None
    if proof is None or not hmac.compare_digest(expected.encode(), proof.encode()):
        return Refusal(AUTH, "cluster secret mismatch (HMAC proof failed)")
    return None
