"""Encryption of a peer link: the key schedule and the sealing of messages (pure logic).

Every link is encrypted, with or without a cluster secret. Each side of a handshake makes a
fresh X25519 key pair (`EphemeralKey`) and sends its public half in its hello; both derive,
with HKDF-SHA256, one ChaCha20-Poly1305 key per direction from

- the X25519 shared secret (forward secrecy: the private halves are never stored or sent, so
  a recorded link cannot be read later, even by someone who learns the cluster secret),
- the handshake transcript (both ids, nonces and public keys: `handshake.transcript`), and
- the cluster secret, if there is one, as HKDF's salt: a man in the middle who swaps the
  public keys for its own derives other keys than either end (and cannot forge the HMAC
  proofs, which cover the same transcript), so it can neither read nor join.

Without a secret nothing authenticates the public keys: the link is private against anyone
who only listens, not against one who sits in the middle from the first packet.

Each message is sealed under its direction's key with a 96-bit nonce made of a counter that
starts at 0 and counts every message (never sent: TCP keeps the order, and both ends count).
A message that was tampered with, replayed, reordered, dropped or sealed under other keys
does not open under the counter the receiver expects: `TamperedMessage`, and the link closes.
The counter never wraps (2**64 messages), so a nonce is never used twice under one key.
"""

from __future__ import annotations

import hashlib

import attrs
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from trexo.errors import SecureChannelError, TamperedMessage

PUBLIC_KEY_BYTES = 32
"""An X25519 public key."""
KEY_BYTES = 32
"""A ChaCha20-Poly1305 key."""
TAG_BYTES = 16
"""What sealing adds to each message (Poly1305's tag)."""
NONCE_BYTES = 12
COUNTER_LIMIT = 1 << 64
"""Messages one direction may carry; past it the link must be made anew (never, in practice)."""
KDF_INFO = b"trexo peer link v2: dialer->acceptor, acceptor->dialer"
SECRET_SALT_LABEL = b"trexo cluster secret as HKDF salt\0"
"""Keeps the salt apart from the secret's other use (the handshake's HMAC proofs)."""


class KeyExchangeFailed(ValueError):
    """The peer's public key gives no usable shared secret (a low-order point)."""


class EphemeralKey:
    """One handshake's X25519 key pair: made fresh for every handshake, used once."""

    def __init__(self) -> None:
        self._private = X25519PrivateKey.generate()
        self.public: bytes = self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def exchange(self, peer_public: bytes) -> bytes:
        """The shared secret with `peer_public`; `KeyExchangeFailed` for a degenerate key."""
        if len(peer_public) != PUBLIC_KEY_BYTES:
            raise KeyExchangeFailed(f"a public key has {PUBLIC_KEY_BYTES} bytes")
        try:
            return self._private.exchange(X25519PublicKey.from_public_bytes(peer_public))
        except ValueError as exc:  # OpenSSL refuses an all-zero result (low-order point)
            raise KeyExchangeFailed(str(exc)) from None

    def __repr__(self) -> str:
        return f"<EphemeralKey {self.public.hex()[:16]}…>"


@attrs.frozen
class DirectionKeys:
    """The two keys of a link, named by who seals with each."""

    dialer: bytes = attrs.field(repr=False)
    acceptor: bytes = attrs.field(repr=False)


def derive_keys(shared: bytes, transcript: bytes, secret: bytes | None) -> DirectionKeys:
    """HKDF-SHA256 of the shared secret, salted with the cluster secret (if any), bound to
    the handshake's transcript."""
    salt = None if secret is None else hashlib.sha256(SECRET_SALT_LABEL + secret).digest()
    info = KDF_INFO + b"\0" + hashlib.sha256(transcript).digest()
    okm = HKDF(algorithm=hashes.SHA256(), length=2 * KEY_BYTES, salt=salt, info=info).derive(shared)
    return DirectionKeys(dialer=okm[:KEY_BYTES], acceptor=okm[KEY_BYTES:])


class _Direction:
    """One direction's AEAD and message counter."""

    def __init__(self, key: bytes) -> None:
        self.aead = ChaCha20Poly1305(key)
        self.counter = 0

    def next_nonce(self) -> bytes:
        if self.counter >= COUNTER_LIMIT:
            raise SecureChannelError("this link has used up its nonces; it must be made anew")
        nonce = self.counter.to_bytes(NONCE_BYTES, "big")
        self.counter += 1
        return nonce


class Sealer:
    """Seals the messages one side sends, in the order it sends them."""

    def __init__(self, key: bytes) -> None:
        self._direction = _Direction(key)

    @property
    def sealed(self) -> int:
        """Messages sealed so far (the next one's counter)."""
        return self._direction.counter

    def seal(self, plaintext: bytes) -> bytes:
        direction = self._direction
        return direction.aead.encrypt(direction.next_nonce(), plaintext, None)


class Opener:
    """Opens the messages one side receives; each must be the next one the peer sealed."""

    def __init__(self, key: bytes) -> None:
        self._direction = _Direction(key)

    @property
    def opened(self) -> int:
        """Messages opened so far (the counter the next one must have)."""
        return self._direction.counter

    def open(self, sealed: bytes) -> bytes:
        """The plaintext; `TamperedMessage` if `sealed` is not the peer's next message, whole
        and unchanged. After a failure the opener is spent: the link must close."""
        direction = self._direction
        expected = direction.counter
        try:
            return direction.aead.decrypt(direction.next_nonce(), sealed, None)
        except InvalidTag:
            raise TamperedMessage(
                f"message {expected} failed authentication "
                "(tampered with, replayed, reordered or sealed under other keys)"
            ) from None


@attrs.frozen
class SecureChannel:
    """One side's half of a link's encryption: what it sends, what it receives."""

    sealer: Sealer
    opener: Opener

    @classmethod
    def for_dialer(cls, keys: DirectionKeys) -> SecureChannel:
        return cls(Sealer(keys.dialer), Opener(keys.acceptor))

    @classmethod
    def for_acceptor(cls, keys: DirectionKeys) -> SecureChannel:
        return cls(Sealer(keys.acceptor), Opener(keys.dialer))
