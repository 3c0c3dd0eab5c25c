"""Configuration: every default is a named constant here, grouped in attrs config classes.

Durations are seconds (floats) so that tests can drive them with `trio.testing.MockClock`.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

# --- paths -------------------------------------------------------------------------------

TREXO_HOME_ENV = "TREXO_HOME"
"""Environment variable that overrides the data directory (models, logs, node id)."""


def default_data_dir() -> Path:
    """`$TREXO_HOME`, else `$XDG_DATA_HOME/trexo`, else `~/.local/share/trexo`."""
    if home := os.environ.get(TREXO_HOME_ENV):
        return Path(home).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg).expanduser() / "trexo"


@attrs.frozen
class Paths:
    """Where a node keeps its files; everything lives below one data directory."""

    data_dir: Path = attrs.field(factory=default_data_dir, converter=Path)

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def runner_logs_dir(self) -> Path:
        return self.logs_dir / "runners"


# --- wire --------------------------------------------------------------------------------

MAX_FRAME_BYTES = 16 * 1024 * 1024
"""Largest frame body accepted on a runner socket or peer link; larger is a protocol error."""

# --- runner ------------------------------------------------------------------------------

SHUTDOWN_GRACE_S = 2.0
"""After `Shutdown` (and closing our socket end), how long a runner may take to exit."""
TERM_GRACE_S = 1.0
"""After SIGTERM, how long before SIGKILL."""
KILL_GRACE_S = 2.0
"""After SIGKILL, how long to wait for the kernel to report the exit (it always does)."""
COMPUTE_JOIN_TIMEOUT_S = 1.5
"""Inside a runner: how long to wait for the compute thread to finish before `os._exit`."""
RUNNER_OPENBLAS_THREADS = 1
"""Several MLX processes on one machine thrash with OpenBLAS's default thread count."""
LOAD_TIMEOUT_S = 300.0
"""Upper bound on loading a model into a runner (bounds the wait, not the runner)."""


@attrs.frozen
class RunnerConfig:
    """Timeouts and limits of one runner process and its supervisor."""

    shutdown_grace: float = SHUTDOWN_GRACE_S
    term_grace: float = TERM_GRACE_S
    kill_grace: float = KILL_GRACE_S
    compute_join_timeout: float = COMPUTE_JOIN_TIMEOUT_S
    load_timeout: float = LOAD_TIMEOUT_S
    max_frame_bytes: int = MAX_FRAME_BYTES
    openblas_threads: int = RUNNER_OPENBLAS_THREADS

    @property
    def stop_bound(self) -> float:
        """The longest a whole stop ladder can take."""
        return self.shutdown_grace + self.term_grace + self.kill_grace


# --- supervision ---------------------------------------------------------------------------

MAX_RESTARTS = 5
"""Restart intensity: more than this many restarts within `RESTART_WINDOW_S` gives up."""
RESTART_WINDOW_S = 30.0
BACKOFF_INITIAL_S = 0.1
BACKOFF_MAX_S = 5.0
BACKOFF_FACTOR = 2.0


@attrs.frozen
class RestartPolicy:
    """Erlang/OTP-style restart intensity plus exponential backoff between restarts."""

    max_restarts: int = MAX_RESTARTS
    window: float = RESTART_WINDOW_S
    backoff_initial: float = BACKOFF_INITIAL_S
    backoff_max: float = BACKOFF_MAX_S
    backoff_factor: float = BACKOFF_FACTOR

    def backoff(self, attempt: int) -> float:
        """Delay before restart number `attempt` (1-based)."""
        return min(self.backoff_max, self.backoff_initial * self.backoff_factor ** (attempt - 1))
