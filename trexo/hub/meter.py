"""A download's rate and time left, from how far it was at recent moments. Pure."""

from __future__ import annotations

from collections import deque


class RateMeter:
    """Bytes per second over the last `window` seconds of `record(now, done)` calls."""

    def __init__(self, window: float) -> None:
        self._window = window
        self._samples: deque[tuple[float, int]] = deque()

    def record(self, now: float, done: int) -> None:
        if self._samples and done < self._samples[-1][1]:
            self._samples.clear()  # it started over (a file that failed its check)
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self._window:
            self._samples.popleft()

    def rate(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0

    def eta(self, done: int, total: int) -> float | None:
        """Seconds until `total` at the current rate; None while the rate is unknown."""
        rate = self.rate()
        if done >= total:
            return 0.0
        return (total - done) / rate if rate > 0 else None
