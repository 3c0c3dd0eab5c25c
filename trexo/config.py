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

    @property
    def events_dir(self) -> Path:
        """The master's durable event logs, one file per session."""
        return self.data_dir / "events"


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


# --- worker ----------------------------------------------------------------------------------

RUNNER_MAX_ATTEMPTS = 3
"""Starts of an instance's runner on one node before the worker gives up on it."""
RUNNER_RETRY_BACKOFF_S = 1.0
"""Pause before restarting a runner that failed."""
NODE_REPORT_INTERVAL_S = 5.0
"""How often a worker re-reports its node's memory figures."""
STREAM_SEND_TIMEOUT_S = 10.0
"""Bound on handing one chunk to the requesting node; past it the generation is cancelled."""
MEMORY_REPORT_THRESHOLD_BYTES = 256 * 1024 * 1024
"""A change of available memory smaller than this is not worth an event."""


# --- master --------------------------------------------------------------------------------

PLACEMENT_MEMORY_OVERHEAD = 1.2
"""Memory an instance needs per byte of weights: the rest is KV cache and activations."""
EVENT_LOG_FSYNC_INTERVAL_S = 0.05
"""The event log fsyncs at most this often (and on close); 0 fsyncs every event.

An fsync takes 0.2 ms on a quiet disk but ~4 ms (p99 ~8 ms) while other processes write,
over the ~1 ms an event may add to the master's hot path; so events are written and flushed
one by one and fsynced in batches: a process crash loses nothing, a power loss this window.
"""


@attrs.frozen
class MasterConfig:
    """Knobs of the master service: placement and its event log."""

    memory_overhead: float = PLACEMENT_MEMORY_OVERHEAD
    fsync_interval: float = EVENT_LOG_FSYNC_INTERVAL_S


# --- state view ----------------------------------------------------------------------------

REPLAY_RETRY_S = 1.0
"""A state view re-asks the master for missing events after this long if the gap persists."""
MAX_PENDING_EVENTS = 10_000
"""Out-of-order events a state view buffers while a gap is repaired; later ones are dropped
(the replay brings them again)."""


@attrs.frozen
class StateViewConfig:
    """Knobs of a node's view of the session's event stream."""

    replay_retry: float = REPLAY_RETRY_S
    max_pending: int = MAX_PENDING_EVENTS


# --- node and API ----------------------------------------------------------------------------

COMMAND_WAIT_S = 10.0
"""How long an API command waits for a session (and for the master's reply) before 503."""
GENERATION_IDLE_TIMEOUT_S = 300.0
"""A generation that produces nothing for this long is ended with an error."""
CANCEL_SEND_TIMEOUT_S = 0.5
"""Bound on telling the cluster that a consumer went away."""
DEFAULT_MODEL_RETRY_S = 2.0
"""Pause before trying again to place the default model after a refusal or timeout."""


# --- api -----------------------------------------------------------------------------------

DEFAULT_API_HOST = "127.0.0.1"
"""Loopback by default: exposing the API to the LAN is an explicit choice (`--api-host`)."""
API_PORT = 52415
"""exo's port, so tools configured for exo find trexo."""
API_MAX_BODY_BYTES = 4 * 1024 * 1024
"""Largest request body accepted; larger is HTTP 413."""
API_BODY_TIMEOUT_S = 30.0
"""How long a client may take to send its request body; slower is HTTP 408."""
API_KEEPALIVE_INTERVAL_S = 15.0
"""A stream that has been silent this long gets an SSE comment, so proxies keep it open."""


@attrs.frozen
class ApiConfig:
    """Where the HTTP API listens and the limits it enforces on requests."""

    host: str = DEFAULT_API_HOST
    port: int = API_PORT
    """0 picks a free port; the API service reports the bound address."""
    max_body_bytes: int = API_MAX_BODY_BYTES
    body_timeout: float = API_BODY_TIMEOUT_S
    keepalive_interval: float = API_KEEPALIVE_INTERVAL_S
