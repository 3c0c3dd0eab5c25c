"""How slow this process itself is, so that it does not mistake its own slowness for its
peers' (pure logic; times are passed in, from any one clock).

Used by a node's peer links (`trexo.net.link`) and by a rank's stall watchdog
(`trexo.runner.serve`). A node whose event loop runs late — a long GC pause, a page-fault
storm, a CPU-starved machine, a SIGSTOP — hears nothing from anyone while it is stalled, and
when it runs again every peer looks silent. HashiCorp's Lifeguard answers this with a local
health score: a node that sees its own timers fire late counts itself unhealthy and
lengthens its own timeouts, instead of accusing others. Here:

- every stall of this node's loop (a timer that fired more than `threshold` late) is
  recorded, and the time it lasted does not count as a peer's silence (`stalled_since`);
- each stall raises the score by one (up to `max_score`); each `recovery` seconds without a
  stall lowers it by one; timeouts are multiplied by `1 + score` (`multiplier`).

A process can be slowed without its own timers firing late: a rank waiting in a collective
for a peer that shares its busy machine. For such bounds, `machine_load_stretch` reads the
machine's load average (more runnable processes than cores: everything takes longer).
"""

from __future__ import annotations

import os
from collections import deque

LAG_THRESHOLD_S = 0.1
"""A timer this much late is a stall of this node, not a scheduling jitter."""
MAX_SCORE = 8
"""Lifeguard's default: timeouts stretch to at most 9 times their base."""
RECOVERY_S = 2.0
"""Seconds without a stall for the score to drop by one."""
REMEMBERED_STALLS = 64
"""Stalls kept to discount from silences (older ones are past any silence still judged)."""


class LocalHealth:
    def __init__(
        self,
        threshold: float = LAG_THRESHOLD_S,
        max_score: int = MAX_SCORE,
        recovery: float = RECOVERY_S,
    ) -> None:
        self.threshold = threshold
        self.max_score = max_score
        self.recovery = recovery
        self._score = 0
        self._scored_at = 0.0
        self._stalls: deque[tuple[float, float]] = deque(maxlen=REMEMBERED_STALLS)
        """(start, end) of each stall, oldest first, none overlapping."""

    def observe(self, now: float, lateness: float) -> None:
        """A timer due `lateness` seconds ago fired at `now`."""
        if lateness <= self.threshold:
            return
        start = now - lateness
        if self._stalls and self._stalls[-1][1] >= start:
            # The same stall, seen by another timer: one stall, as long as either saw it.
            earlier, _ = self._stalls.pop()
            self._stalls.append((min(earlier, start), now))
            return
        self._score = min(self.max_score, self.score(now) + 1)
        self._scored_at = now
        self._stalls.append((start, now))

    def score(self, now: float) -> int:
        recovered = int((now - self._scored_at) / self.recovery) if self.recovery > 0 else 0
        return max(0, self._score - recovered)

    def multiplier(self, now: float) -> float:
        """What this node's failure-detection timeouts are multiplied by now."""
        return 1.0 + self.score(now)

    def stalled_since(self, since: float) -> float:
        """Seconds this node was stalled after `since` (not a peer's silence)."""
        return sum(max(0.0, end - max(start, since)) for start, end in self._stalls)


def load_stretch(load_average: float, cores: int) -> float:
    """How much longer work takes on a machine whose run queue holds `load_average`
    processes for `cores` cores: 1.0 up to one per core, then in proportion."""
    return max(1.0, load_average / max(1, cores))


def machine_load_stretch() -> float:
    """`load_stretch` of this machine now (its 1-minute load average), for bounds on work
    that several processes of this machine share: ranks of one split model starting and
    stepping together wait on each other's CPU time."""
    try:
        load_average = os.getloadavg()[0]
    except OSError:
        return 1.0
    return load_stretch(load_average, os.cpu_count() or 1)
