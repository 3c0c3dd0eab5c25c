"""The nodes this node has heard of and will dial, in order, at a bounded rate (pure).

Gossip and beacons come from peers: a list of a thousand addresses must not become a
thousand dials at once (a dial storm, or a port scan run through this node). Targets wait
here, a bounded number of them, each node once; they leave at most `rate` per second after
a burst of `burst` (a token bucket), so a real cluster's handful of peers is dialled at
once and a hostile list is dialled slowly and only in part.
"""

from __future__ import annotations

import collections

from trexo.net.gossip import PeerInfo
from trexo.types.ids import NodeId


class TokenBucket:
    """`burst` tokens at most, refilled at `rate` per second."""

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._updated = now

    def _refill(self, now: float) -> None:
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now

    def wait(self, now: float) -> float:
        """Seconds until a token is there (0: one is)."""
        self._refill(now)
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.rate

    def take(self, now: float) -> bool:
        self._refill(now)
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class DialQueue:
    def __init__(self, *, capacity: int, rate: float, burst: int, now: float) -> None:
        self.capacity = capacity
        self._queue: collections.OrderedDict[NodeId, PeerInfo] = collections.OrderedDict()
        self._bucket = TokenBucket(rate, burst, now)
        self.dropped = 0
        """Targets refused because the queue was full."""

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._queue

    def offer(self, target: PeerInfo) -> bool:
        """Queue `target` (once per node); False if the queue is full."""
        if target.node_id in self._queue:
            return True
        if len(self._queue) >= self.capacity:
            self.dropped += 1
            return False
        self._queue[target.node_id] = target
        return True

    def wait(self, now: float) -> float:
        """Seconds until the next target may be dialled (if one waits)."""
        return self._bucket.wait(now)

    def pop(self, now: float) -> PeerInfo | None:
        """The next target, if one waits and the rate allows it now."""
        if not self._queue or not self._bucket.take(now):
            return None
        _, target = self._queue.popitem(last=False)
        return target
