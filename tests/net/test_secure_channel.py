"""A link's encryption (pure): the key schedule, sealing and opening, and the handshake's part."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trexo.errors import SecureChannelError, TamperedMessage
from trexo.net import handshake as hs
from trexo.net import secure_channel as sc
from trexo.types.ids import NodeId

messages = st.lists(st.binary(max_size=300), min_size=1, max_size=8)
secrets_ = st.none() | st.binary(min_size=1, max_size=32)


def handshake(
    secret: bytes | None = None, acceptor_secret: bytes | None = None
) -> tuple[sc.SecureChannel, sc.SecureChannel]:
    """A dialer's and an acceptor's channels, as the handshake derives them."""
    d_key, a_key = sc.EphemeralKey(), sc.EphemeralKey()
    dialer = hs.Identity(NodeId("d"), "trexo", 2, 1, secret).hello((), d_key)
    acceptor = hs.Identity(NodeId("a"), "trexo", 2, 1, acceptor_secret).hello((), a_key)
    d_keys = hs.link_keys(secret, d_key, dialer, acceptor, role=hs.DIALER)
    a_keys = hs.link_keys(acceptor_secret, a_key, dialer, acceptor, role=hs.ACCEPTOR)
    assert isinstance(d_keys, sc.DirectionKeys)
    assert isinstance(a_keys, sc.DirectionKeys)
    return sc.SecureChannel.for_dialer(d_keys), sc.SecureChannel.for_acceptor(a_keys)


@given(secret=secrets_, sent=messages, replies=messages)
def test_messages_round_trip_both_ways(
    secret: bytes | None, sent: list[bytes], replies: list[bytes]
) -> None:
    dialer, acceptor = handshake(secret, secret)
    for message in sent:
        sealed = dialer.sealer.seal(message)
        assert len(sealed) == len(message) + sc.TAG_BYTES
        assert acceptor.opener.open(sealed) == message
    for message in replies:
        assert dialer.opener.open(acceptor.sealer.seal(message)) == message


@given(message=st.binary(max_size=200), data=st.data())
def test_any_flipped_bit_fails_to_open(message: bytes, data: st.DataObject) -> None:
    dialer, acceptor = handshake()
    sealed = bytearray(dialer.sealer.seal(message))
    index = data.draw(st.integers(0, len(sealed) - 1))
    sealed[index] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(TamperedMessage, match="failed authentication"):
        acceptor.opener.open(bytes(sealed))


@given(message=st.binary(max_size=200), cut=st.integers(1, 40))
def test_truncated_or_extended_messages_fail_to_open(message: bytes, cut: int) -> None:
    dialer, acceptor = handshake()
    sealed = dialer.sealer.seal(message)
    with pytest.raises(TamperedMessage):
        acceptor.opener.open(sealed[:-cut])
    dialer, acceptor = handshake()
    with pytest.raises(TamperedMessage):
        acceptor.opener.open(dialer.sealer.seal(message) + b"\0")


def test_a_replayed_message_fails_to_open() -> None:
    dialer, acceptor = handshake(b"s", b"s")
    sealed = dialer.sealer.seal(b"place instance")
    assert acceptor.opener.open(sealed) == b"place instance"
    with pytest.raises(TamperedMessage, match="message 1 failed"):
        acceptor.opener.open(sealed)


def test_reordered_or_dropped_messages_fail_to_open() -> None:
    dialer, acceptor = handshake()
    dialer.sealer.seal(b"one")
    with pytest.raises(TamperedMessage):
        acceptor.opener.open(dialer.sealer.seal(b"two"))
    dialer, acceptor = handshake()
    dialer.sealer.seal(b"dropped on the way")
    with pytest.raises(TamperedMessage):
        acceptor.opener.open(dialer.sealer.seal(b"next"))


def test_a_message_sent_back_to_its_sender_fails_to_open() -> None:
    dialer, _acceptor = handshake()
    with pytest.raises(TamperedMessage):  # one key per direction: no reflection
        dialer.opener.open(dialer.sealer.seal(b"echo"))


def test_a_message_from_another_link_fails_to_open() -> None:
    old_dialer, _ = handshake(b"s", b"s")
    _, new_acceptor = handshake(b"s", b"s")  # fresh keys: a recorded message is useless
    with pytest.raises(TamperedMessage):
        new_acceptor.opener.open(old_dialer.sealer.seal(b"recorded"))


@given(secret=st.binary(min_size=1, max_size=16), other=st.binary(min_size=1, max_size=16))
def test_sides_with_different_secrets_cannot_read_each_other(secret: bytes, other: bytes) -> None:
    dialer, acceptor = handshake(secret, other)
    sealed = dialer.sealer.seal(b"hello")
    if secret == other:
        assert acceptor.opener.open(sealed) == b"hello"
    else:
        with pytest.raises(TamperedMessage):
            acceptor.opener.open(sealed)


@given(count=st.integers(1, 50))
def test_nonces_never_repeat(count: int) -> None:
    dialer, _ = handshake()
    seen = {dialer.sealer.seal(b"same") for _ in range(count)}
    assert len(seen) == count  # the same plaintext never seals the same way twice
    assert dialer.sealer.sealed == count


def test_a_used_up_counter_refuses_to_seal_rather_than_repeat_a_nonce() -> None:
    dialer, _ = handshake()
    dialer.sealer._direction.counter = sc.COUNTER_LIMIT - 1
    dialer.sealer.seal(b"last")
    with pytest.raises(SecureChannelError, match="used up"):
        dialer.sealer.seal(b"one too many")


def test_keys_bind_the_transcript_and_the_secret() -> None:
    shared = bytes(range(32))
    base = sc.derive_keys(shared, b"transcript", None)
    assert base == sc.derive_keys(shared, b"transcript", None)
    assert base.dialer != base.acceptor
    assert base != sc.derive_keys(shared, b"other transcript", None)
    assert base != sc.derive_keys(shared, b"transcript", b"secret")
    assert sc.derive_keys(shared, b"t", b"a") != sc.derive_keys(shared, b"t", b"b")
    assert repr(base) == "DirectionKeys()"  # keys never reach a log line


def test_a_man_in_the_middle_without_the_secret_fails_the_proofs() -> None:
    """Mallory relays the hellos but swaps the public keys for its own (to read the link):
    the transcript each side proves over then differs from the other's, so the proofs fail."""
    secret = b"cluster secret"
    d_key, a_key, m_key = sc.EphemeralKey(), sc.EphemeralKey(), sc.EphemeralKey()
    dialer = hs.Identity(NodeId("d"), "trexo", 2, 1, secret).hello((), d_key)
    acceptor = hs.Identity(NodeId("a"), "trexo", 2, 1, secret).hello((), a_key)
    to_acceptor = attrs.evolve(dialer, key=m_key.public.hex())  # what the acceptor sees
    to_dialer = attrs.evolve(acceptor, key=m_key.public.hex())  # what the dialer sees
    acceptor_proof = hs.make_proof(secret, hs.ACCEPTOR, to_acceptor, acceptor)
    assert hs.check_proof(secret, hs.ACCEPTOR, dialer, to_dialer, acceptor_proof) is not None
    dialer_proof = hs.make_proof(secret, hs.DIALER, dialer, to_dialer)
    assert hs.check_proof(secret, hs.DIALER, to_acceptor, acceptor, dialer_proof) is not None


@pytest.mark.parametrize(
    "key", ["00" * 32, "01" + "00" * 31], ids=["zero point", "low-order point"]
)
def test_a_degenerate_public_key_is_refused(key: str) -> None:
    d_key = sc.EphemeralKey()
    dialer = hs.Identity(NodeId("d"), "trexo", 2, 1).hello((), d_key)
    acceptor = attrs.evolve(hs.Identity(NodeId("a"), "trexo", 2, 1).hello((), d_key), key=key)
    refusal = hs.link_keys(None, d_key, dialer, acceptor, role=hs.DIALER)
    assert isinstance(refusal, hs.Refusal)
    assert refusal.code == hs.PROTOCOL


@pytest.mark.parametrize("key", ["", "zz" * 32, "00" * 31, "00" * 33])
def test_a_hello_without_a_public_key_is_refused(key: str) -> None:
    me = hs.Identity(NodeId("me"), "trexo", 2, 1)
    hello = attrs.evolve(hs.Identity(NodeId("p"), "trexo", 2, 1).hello((), sc.EphemeralKey()))
    refusal = hs.check_hello(me, attrs.evolve(hello, key=key))
    assert refusal is not None
    assert refusal.code == hs.PROTOCOL


def test_each_handshake_has_fresh_keys() -> None:
    assert sc.EphemeralKey().public != sc.EphemeralKey().public
    assert "EphemeralKey" in repr(sc.EphemeralKey())
