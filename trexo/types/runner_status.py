"""A runner's lifecycle as the parent sees it.

idle -> (downloading ->) loading -> ready <-> running, ending in failed (unexpected) or
stopped (on purpose).
"""

from __future__ import annotations

import attrs


@attrs.frozen
class RunnerIdle:
    """Spawned, nothing loaded yet."""


@attrs.frozen
class RunnerDownloading:
    """Waiting for its node to download the model's files (the node's `downloads` in the
    cluster state say how far it is)."""


@attrs.frozen
class RunnerLoading:
    progress: float = 0.0
    """0.0 .. 1.0"""


@attrs.frozen
class RunnerReady:
    """Loaded and warmed up, no request in flight."""


@attrs.frozen
class RunnerRunning:
    active_requests: int = 1
    """Generations in its batch. In the cluster state: as when it began running (the log
    does not follow every change of a batch's size; the runner's own node sees them all)."""


@attrs.frozen
class RunnerFailed:
    """Terminal: the runner cannot serve. `cause` is an error message or an exit cause."""

    cause: str
    restart_in: float | None = None
    """Seconds until its worker starts it again (None: not known to be restarting)."""
    permanent: bool = False
    """It failed in a way no restart mends (the model's layout cannot be split so, a file
    is missing, a shape does not match): it is not restarted, and its instance cannot serve
    until it is deleted and placed again differently."""


@attrs.frozen
class RunnerStopped:
    """Terminal: stopped on purpose by its owner. `cause` is how the process ended."""

    cause: str


RunnerStatus = (
    RunnerIdle
    | RunnerDownloading
    | RunnerLoading
    | RunnerReady
    | RunnerRunning
    | RunnerFailed
    | RunnerStopped
)
TERMINAL_STATUSES = (RunnerFailed, RunnerStopped)
