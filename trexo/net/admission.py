"""Which incoming connections may start a handshake (pure bookkeeping).

Until its handshake ends, a connection is nobody's: the port is open to anyone, and a
handshake costs this node a key exchange and an HMAC before the other side has proved
anything. So connections that are still handshaking are capped, in all and per source
address; one past a cap is closed at once, before any of that work. The caps bound how
much handshake work can be ready at one moment, and so how long it can hold up the event
loop, whose heartbeats keep the established links alive. A flood can still delay new
links (a refused dialler retries, with backoff); it cannot take down those that exist.
"""

from __future__ import annotations

import collections


class HandshakeAdmission:
    def __init__(self, *, max_total: int, max_per_host: int) -> None:
        self.max_total = max_total
        self.max_per_host = max_per_host
        self._by_host: collections.Counter[str] = collections.Counter()
        self._total = 0
        self.refused = 0

    @property
    def pending(self) -> int:
        """Connections admitted whose handshake has not ended yet."""
        return self._total

    def admit(self, host: str) -> Slot | None:
        """A slot for a new connection from `host` to handshake in (release it when the
        handshake ends, however it ends), or None: close the connection."""
        if self._total >= self.max_total or self._by_host[host] >= self.max_per_host:
            self.refused += 1
            return None
        self._total += 1
        self._by_host[host] += 1
        return Slot(self, host)

    def _release(self, host: str) -> None:
        self._total -= 1
        self._by_host[host] -= 1
        if self._by_host[host] <= 0:
            del self._by_host[host]


class Slot:
    """One admitted connection's place among those handshaking."""

    def __init__(self, admission: HandshakeAdmission, host: str) -> None:
        self._admission: HandshakeAdmission | None = admission
        self.host = host

    def release(self) -> None:
        """Free the place (once; later calls do nothing)."""
        if self._admission is not None:
            self._admission._release(self.host)
            self._admission = None
