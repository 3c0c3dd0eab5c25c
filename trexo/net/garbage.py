"""Counting a peer's bad messages in a sliding window (pure logic)."""

from __future__ import annotations

from collections import deque

import attrs


@attrs.define
class GarbageMeter:
    """Bad messages from one peer: more than `limit` within `window` seconds is too many.

    A single bad message is dropped and forgiven (a newer peer may send a message this node
    does not know yet); a stream of them means a broken or hostile peer.
    """

    limit: int
    window: float
    _times: deque[float] = attrs.field(factory=deque, init=False)

    def record(self, now: float) -> bool:
        """Count one bad message at `now`; True when the peer has now sent too many."""
        self._times.append(now)
        while self._times and now - self._times[0] >= self.window:
            self._times.popleft()
        return len(self._times) > self.limit

    def count(self, now: float) -> int:
        """Bad messages within the window that ends at `now`."""
        return sum(1 for t in self._times if now - t < self.window)
