"""The handshake's checks and proofs (pure)."""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st

from trexo.net import handshake as hs
from trexo.net.secure_channel import EphemeralKey
from trexo.types.ids import NodeId

ME = hs.Identity(NodeId("me"), "trexo", 1, 52416)


def hello_from(name: str = "peer", **changes: object) -> hs.Hello:
    base = hs.Identity(NodeId(name), "trexo", 1, 52416, secret=None).hello((), EphemeralKey())
    return attrs.evolve(base, **changes)


def test_matching_hello_is_accepted() -> None:
    assert hs.check_hello(ME, hello_from()) is None


def test_each_mismatch_is_refused_with_a_reason() -> None:
    refusal = hs.check_hello(ME, hello_from(namespace="other"))
    assert refusal == hs.Refusal(hs.NAMESPACE, "namespace 'other' != 'trexo'")
    refusal = hs.check_hello(ME, hello_from(version=2))
    assert refusal == hs.Refusal(hs.VERSION, "protocol version 2 != 1")
    refusal = hs.check_hello(ME, hello_from("me"))
    assert refusal is not None and refusal.code == hs.SELF_LINK
    refusal = hs.check_hello(ME, hello_from(authenticated=True))
    assert refusal is not None and refusal.code == hs.AUTH
    with_secret = attrs.evolve(ME, secret=b"k")
    refusal = hs.check_hello(with_secret, hello_from(authenticated=False))
    assert refusal is not None and refusal.code == hs.AUTH


def test_version_is_checked_before_decoding() -> None:
    future = {"type": "Hello", "version": 7, "some_new_field": 1}
    assert hs.check_version(future, 1) == hs.Refusal(hs.VERSION, "protocol version 7 != 1")
    assert hs.check_version({"type": "Hello", "version": 1}, 1) is None
    assert hs.check_version({"type": "Proof"}, 1) is None


def test_hello_nonces_are_fresh() -> None:
    assert ME.hello((), EphemeralKey()).nonce != ME.hello((), EphemeralKey()).nonce
    assert len(ME.hello((), EphemeralKey()).nonce) == 2 * hs.NONCE_BYTES


def test_secret_is_not_in_the_identity_repr() -> None:
    assert "hunter2" not in repr(attrs.evolve(ME, secret=b"hunter2"))


secrets_ = st.binary(min_size=1, max_size=64)


@given(secret=secrets_, other=secrets_)
def test_proofs_verify_only_with_the_same_secret(secret: bytes, other: bytes) -> None:
    dialer, acceptor = hello_from("d"), hello_from("a")
    proof = hs.make_proof(secret, hs.DIALER, dialer, acceptor)
    assert proof is not None
    assert hs.check_proof(secret, hs.DIALER, dialer, acceptor, proof) is None
    if other != secret:
        assert hs.check_proof(other, hs.DIALER, dialer, acceptor, proof) is not None


@given(secret=secrets_)
def test_a_proof_cannot_be_reflected_or_replayed(secret: bytes) -> None:
    dialer, acceptor = hello_from("d"), hello_from("a")
    acceptor_proof = hs.make_proof(secret, hs.ACCEPTOR, dialer, acceptor)
    # The acceptor's proof, sent back as the dialer's, fails (roles are in the MAC) ...
    assert hs.check_proof(secret, hs.DIALER, dialer, acceptor, acceptor_proof) is not None
    # ... and so does a proof from another handshake (the nonces are in the MAC).
    fresh = attrs.evolve(acceptor, nonce=hs.new_nonce())
    assert hs.check_proof(secret, hs.ACCEPTOR, dialer, fresh, acceptor_proof) is not None


def test_missing_proof_is_refused_and_no_secret_needs_none() -> None:
    dialer, acceptor = hello_from("d"), hello_from("a")
    assert hs.check_proof(b"k", hs.DIALER, dialer, acceptor, None) is not None
    assert hs.check_proof(None, hs.DIALER, dialer, acceptor, None) is None
    assert hs.make_proof(None, hs.DIALER, dialer, acceptor) is None
