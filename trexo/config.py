"""Configuration: every default is a named constant here, grouped in attrs config classes.

Durations are seconds (floats) so that tests can drive them with `trio.testing.MockClock`.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from trexo.types.models import ModelRef

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
    def node_log(self) -> Path:
        """The node's own log (rotated; see `NODE_LOG_MAX_BYTES`)."""
        return self.logs_dir / "node.log"

    @property
    def events_dir(self) -> Path:
        """The master's durable event logs, a directory per session."""
        return self.data_dir / "events"


# --- process -------------------------------------------------------------------------------

FD_LIMIT_FALLBACK = 10240
"""macOS refuses a soft file descriptor limit above OPEN_MAX (10240) even when the hard
limit is "unlimited"; the node then raises its soft limit to this instead."""

NODE_LOG_MAX_BYTES = 10 * 1024 * 1024
"""The node log is rotated at this size ..."""
NODE_LOG_BACKUPS = 3
"""... keeping this many older files (node.log.1 ... node.log.3)."""

# --- wire --------------------------------------------------------------------------------

MAX_FRAME_BYTES = 16 * 1024 * 1024
"""Largest frame body accepted on a runner socket or peer link; larger is a protocol error."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in JSON from outside (peers, runners, HTTP
clients). Ours reaches 7 (an indexed event inside an envelope). Checked before parsing, so
a hostile `[[[[...` costs one linear scan, never a recursion."""
MAX_JSON_INT_DIGITS = 20
"""Longest integer literal accepted in such JSON: 20 digits hold any 64-bit integer; longer
ones are no value of ours (and Python converts them in quadratic time)."""
MAX_ERROR_DETAIL_CHARS = 200
"""How much of a bad input an error message (and so a log line or a refusal) quotes."""

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
LOAD_SILENCE_S = 120.0
"""How long a starting or loading runner may show no progress (less than `PROGRESS_MIN_CPU_S`
of CPU used and `PROGRESS_MIN_READ_BYTES` read) before it is stopped. The load itself takes
as long as the model is large and the machine busy: it is not bounded, its silence is."""
PROGRESS_MIN_CPU_S = 0.1
"""CPU time a process must use between two signs of progress: an idle runner blocked on a
lock or a socket uses milliseconds a minute."""
PROGRESS_MIN_READ_BYTES = 1024 * 1024
"""Bytes a process must read between two signs of progress (a load reads its weights)."""
PROGRESS_POLL_S = 1.0
"""How often a wait bounded by silence samples the process it waits on."""
DEFAULT_PREFILL_STEP_TOKENS = 256
"""Prompt tokens a runner prefills per step. A cancel (a client that left) takes effect
between steps, so this bounds how long a cancelled long prompt keeps the runner busy; and
the streams running beside a long prompt wait for one such chunk per step."""
DEFAULT_MAX_BATCH = 16
"""Generations a runner steps together; more wait in its queue (continuous batching)."""
PROMPT_CACHE_BYTES = 512 * 1024 * 1024
"""The runner's prompt cache (KV states of recent conversations) holds at most this much."""

# --- untrusted computation (chat templates, JSON schemas) and worker threads ----------------

TEMPLATE_RENDER_TIMEOUT_S = 2.0
"""CPU seconds a chat template may take to render one request (its thread's CPU time, so
load does not count). Stock templates take milliseconds for a long conversation; a template
past this is that request's error (400), and it bounds how long a looping template holds a
thread (in a runner: the streams beside it)."""
SCHEMA_COMPILE_CPU_S = 2
"""CPU seconds a `response_format` JSON schema may take to compile (in its own process,
`RLIMIT_CPU`: whole seconds). Ordinary schemas compile in milliseconds, large ones in tens;
a schema built to explode (an `allOf` of regex patterns) takes seconds to minutes, and is
that request's 400. CPU time, not the clock: a busy machine slows a good schema's compile
by the clock, never past this. A runner compiles an accepted schema again on its compute
thread, so this also bounds that stall."""
SCHEMA_COMPILE_WALL_LIMIT_S = 60.0
"""A backstop by the clock for a compiling process that gets no CPU at all (stopped, or
starved for a minute): past it the request is answered 503, retry."""
SCHEMA_COMPILE_MEMORY_BYTES = 1024 * 1024 * 1024
"""Address space of the process compiling a schema (`RLIMIT_AS`): the interpreter and
llguidance take ~30 MB; 22 hostile regex patterns asked for 7.7 GB."""
SCHEMA_COMPILE_START_TIMEOUT_S = 60.0
"""How long the compiling process may take to start (a fresh interpreter: ~0.1 s, seconds on a
busy machine). Bounds silence; past it the request is answered 503, retry."""
SCHEMA_COMPILE_PROCESSES = 2
"""Schemas compiled at once (each in its own process, up to `SCHEMA_COMPILE_MEMORY_BYTES`);
more wait their turn."""
SCHEMA_COMPILE_QUEUE_TIMEOUT_S = 30.0
"""How long a schema waits for its turn to compile; past it the request is answered 503,
retry (a flood of hostile schemas holds each turn for `SCHEMA_COMPILE_CPU_S` of CPU at most)."""
SCHEMA_VERDICT_CACHE_SIZE = 256
"""Schemas whose verdict is remembered: a client sends the same schema with every request,
and only the first pays for a process."""
SCHEMA_MATCHERS_CACHED = 16
"""Compiled schemas a runner keeps to copy for the next request with the same schema."""
EVENT_LOG_THREADS = 4
"""Worker threads for the master's event log and snapshots (writes, fsyncs, reads). Its own
pool: no other kind of blocking work can take them, so the log never waits behind a hub or
a template."""
PROMPT_THREADS = 4
"""Worker threads that load tokenizers and count prompt tokens on the API's node."""
HUB_THREADS = 8
"""Worker threads for hub look-ups (resolving a model name to a commit); a slow hub holds at
most these."""
HUB_RESOLVE_TIMEOUT_S = 60.0
"""A hub look-up (name to commit, file list) that has not answered in this long is answered
503 (retry); a hub dripping its answer byte by byte never gets further."""
FILE_THREADS = 8
"""Worker threads for local files and figures (finding or building a model's directory,
reading memory figures)."""

# --- split instances (one model across several nodes) ---------------------------------------

GROUP_INIT_TIMEOUT_S = 10.0
"""How long the ranks of a split instance may take to connect (`mx.distributed.init`
blocks forever on a peer that never comes); past it the runner is stopped by its ladder
and the group rebuilt on new ports."""
GROUP_STALL_TIMEOUT_S = 3.0
"""Inside a rank: longest wait in one collective (a step of its peers, or rank 0's next
command) before the rank declares the group frozen and exits, on a quiet machine. Must
exceed the longest step (a prefill chunk) of the slowest rank; stretched by the rank's own
local health while its process runs late (`trexo.local_health`: up to 9 times)."""
GROUP_IDLE_TICK_S = 0.25
"""An idle rank 0 shares an empty command this often, so that every rank's wait in a
collective stays short and a frozen peer is noticed within `GROUP_STALL_TIMEOUT_S`."""
GROUP_FORMATION_TIMEOUT_S = 30.0
"""How long a node waits, with no sign of progress, for every rank of a split instance to
report its address before it gives up on that epoch (the master rebuilds the group). A rank
reports once its node has the model's files: a download of any length, while its progress
(and the rank's runner status) keeps changing, restarts the bound."""
GROUP_RANK_STAGGER_S = 0.1
"""Once a group is complete, rank r connects r times this late: MLX's ring connects fast
when rank 0 is up first, and retries only about once a second otherwise."""


@attrs.frozen
class RunnerConfig:
    """Timeouts and limits of one runner process and its supervisor."""

    shutdown_grace: float = SHUTDOWN_GRACE_S
    term_grace: float = TERM_GRACE_S
    kill_grace: float = KILL_GRACE_S
    compute_join_timeout: float = COMPUTE_JOIN_TIMEOUT_S
    load_silence: float = LOAD_SILENCE_S
    max_frame_bytes: int = MAX_FRAME_BYTES
    openblas_threads: int = RUNNER_OPENBLAS_THREADS
    prefill_step: int = DEFAULT_PREFILL_STEP_TOKENS
    group_init_timeout: float = GROUP_INIT_TIMEOUT_S
    group_stall_timeout: float = GROUP_STALL_TIMEOUT_S
    group_idle_tick: float = GROUP_IDLE_TICK_S
    group_formation_timeout: float = GROUP_FORMATION_TIMEOUT_S
    group_rank_stagger: float = GROUP_RANK_STAGGER_S
    max_batch: int = DEFAULT_MAX_BATCH
    prompt_cache_bytes: int = PROMPT_CACHE_BYTES

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

    def restart_delay(self, failures_in_window: int) -> float:
        """Delay before restarting something that failed `failures_in_window` times within
        the window: exponential backoff, and past `max_restarts` a cool-down of
        `backoff_max` each time. It is never given up: it heals once it stops failing."""
        if failures_in_window > self.max_restarts:
            return self.backoff_max
        return self.backoff(failures_in_window)


# --- worker ----------------------------------------------------------------------------------

RUNNER_RESTART_POLICY = RestartPolicy(
    max_restarts=3, window=60.0, backoff_initial=0.5, backoff_max=30.0, backoff_factor=2.0
)
"""A runner that dies is restarted after 0.5, 1, 2 s; past 3 deaths within 60 s, every 30 s
(a model that cannot load is not reloaded in a tight loop, and heals once it can)."""
REQUEST_BODY_TTL_S = 30.0
"""A request body that reached the node leading its task, unclaimed this long while its task
is not in the state (cancelled, or lost with a session), is dropped."""
REQUEST_BODIES_MAX_BYTES = 512 * 1024 * 1024
"""Request bodies a node holds for tasks it has not forwarded yet, at most, in all."""
FINISHED_TASKS_REMEMBERED = 10_000
"""Tasks a node remembers having finished, so a new master that missed the report is told
again and the task is never run twice."""
NODE_REPORT_INTERVAL_S = 5.0
"""How often a worker re-reports its node's memory figures."""
NODE_REREPORT_DELAY_S = 0.25
"""How soon a worker reports its node again while the session's state does not list it."""
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
EVENT_LOG_OPEN_RETRY_S = 0.5
"""Out of file descriptors, opening the event log is tried again after this pause ..."""
EVENT_LOG_OPEN_ATTEMPTS = 20
"""... this many times in all (10 s), before the master gives up: without its log it cannot
keep events durably, so its session ends (and the supervisor restarts it with backoff)."""


SNAPSHOT_EVERY_EVENTS = 1000
"""The master snapshots the state after this many events (and rolls its log there); the
events before a snapshot leave its memory and its disk. At ~300 B an event this bounds the
events in memory to ~1 MB, and a joiner's catch-up to one snapshot and fewer events."""
SNAPSHOT_EVERY_S = 60.0
"""... or at the first event this long after the last snapshot."""
RETAINED_SESSIONS = 5
"""Sessions whose log files a node keeps (the current one counted) ..."""
RETAINED_LOG_BYTES = 64 * 1024 * 1024
"""... and at most this many bytes of them, the oldest pruned first (the current session's
files are kept whatever their size; a snapshot bounds them)."""

REMEMBERED_REPLIES = 10_000
"""Replies the master keeps to answer a resent command without deciding it twice."""
REMEMBERED_COMMANDS = 1024
"""Placements and deletions the cluster state remembers by command id (~150 B each), so a
retry with the same idempotency key, or a resend to the next master, is answered from what
was done rather than done twice. Older ones are forgotten first."""
MAX_IDEMPOTENCY_KEY_CHARS = 255
"""The longest `Idempotency-Key` header the API takes (printable ASCII)."""


@attrs.frozen
class MasterConfig:
    """Knobs of the master service: placement, its event log and its snapshots."""

    memory_overhead: float = PLACEMENT_MEMORY_OVERHEAD
    fsync_interval: float = EVENT_LOG_FSYNC_INTERVAL_S
    remembered_replies: int = REMEMBERED_REPLIES
    snapshot_every_events: int = SNAPSHOT_EVERY_EVENTS
    snapshot_every_s: float = SNAPSHOT_EVERY_S
    retained_sessions: int = RETAINED_SESSIONS
    retained_log_bytes: int = RETAINED_LOG_BYTES
    test_snapshot_pause: float = 0.0
    """Tests only: pause this long between writing a snapshot and installing it (a window
    in which to kill the node mid-snapshot). Never set in production."""


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

COMMAND_RESEND_INITIAL_S = 0.02
"""A command unanswered this long is sent again (it may have reached a master still
starting); the pause doubles up to `COMMAND_RESEND_MAX_S`. The master answers resends from
memory, so a command is never decided twice."""
COMMAND_RESEND_MAX_S = 2.0
COMMAND_WAIT_S = 10.0
"""How long an API command waits for a session (and for the master's reply) before 503."""
GENERATION_IDLE_TIMEOUT_S = 300.0
"""A generation that produces nothing for this long is ended with an error."""
ORPHAN_GRACE_S = 0.5
"""After a master change, how long workers have to report the tasks they are still running
before a stream whose task the new session does not list is ended as lost."""
CANCEL_SEND_TIMEOUT_S = 0.5
"""Bound on telling the cluster that a consumer went away."""
DEFAULT_MODEL_RETRY_S = 2.0
"""Pause before trying again to place the default model after a refusal or timeout."""


# --- api -----------------------------------------------------------------------------------

DEFAULT_API_HOST = "127.0.0.1"
"""Loopback by default: exposing the API to the LAN is an explicit choice (`--api-host`)."""
API_PORT = 52415
"""exo's port, so tools configured for exo find trexo."""
OLLAMA_PORT = 11434
"""Ollama's port: `--ollama-port 11434` lets Ollama clients find trexo with their defaults."""
API_MAX_BODY_BYTES = 4 * 1024 * 1024
"""Largest request body accepted; larger is HTTP 413."""
API_BODY_TIMEOUT_S = 30.0
"""How long a client may take to send its request body; slower is HTTP 408."""
API_KEEPALIVE_INTERVAL_S = 15.0
"""A stream that has been silent this long gets an SSE comment, so proxies keep it open."""
API_MAX_CONTEXT_TOKENS: int | None = None
"""A cap on prompt + `max_tokens` below the model's own context (None: the model's)."""
API_STALLED_CLIENT_TIMEOUT_S = 30.0
"""A streaming client that has not taken a chunk for this long is treated as gone: its
generation is cancelled, so a reader that stopped reading cannot hold the runner."""
TOKENIZER_CACHE_SIZE = 8
"""Tokenizers the API's node keeps loaded to count prompt tokens (least recently used go)."""
API_MAX_CONNECTIONS = 1000
"""HTTP connections served at once; more are answered 503 with `Retry-After` and closed.
Lowered at start to fit the file descriptor limit (`API_FD_RESERVE`)."""
API_FD_RESERVE = 256
"""File descriptors kept for everything but HTTP clients (runners, peers, logs, refusals):
the connection cap is at most `fd soft limit - API_FD_RESERVE` (at least half the limit)."""
API_RETRY_AFTER_S = 1.0
"""The `Retry-After` of a 503 when nothing better is known (too many connections, no master
yet, a model still loading)."""
API_REFUSE_LINGER_S = 0.5
"""A refused connection stays open this long after its 503 to read what the client sent,
so that closing does not reset the connection before the client read the answer."""
API_MAX_LINGERING = 64
"""Refused connections kept lingering at once; past it they are closed right after the 503
and a read of what the client already sent (`API_REFUSE_DRAIN_S`)."""
API_REFUSE_DRAIN_S = 0.01
"""A refused connection past the lingering limit reads for this long before it is closed:
what the client sent already is read (no reset), nothing is waited for."""
API_ACCEPT_RETRY_S = 0.1
"""Out of file descriptors, `accept` is retried after this pause (the client waits queued)."""
API_CORS_MAX_AGE_S = 600
"""How long a browser may cache a CORS preflight answer."""
API_KEY_ENV = "TREXO_API_KEY"
"""Environment variable holding an API key (added to `--api-key` and `--api-key-file`'s)."""
API_MAX_EVENT_STREAMS = 64
"""`/state/events` streams open at once (each a dashboard tab or a script); more get 503."""
API_EVENTS_MIN_INTERVAL_S = 0.1
"""Least time between two `/state/events` events: a burst of changes is sent as its last
state, so a busy cluster costs a stream at most this rate (a failover still shows at once)."""
API_EVENTS_RETRY_MS = 1000
"""The SSE `retry:` a `/state/events` stream asks of browsers: how soon an `EventSource`
reconnects after losing it (their default is about 3 s)."""


@attrs.frozen
class ApiConfig:
    """Where the HTTP API listens and the limits it enforces on requests."""

    host: str = DEFAULT_API_HOST
    port: int = API_PORT
    """0 picks a free port; the API service reports the bound address."""
    max_body_bytes: int = API_MAX_BODY_BYTES
    body_timeout: float = API_BODY_TIMEOUT_S
    keepalive_interval: float = API_KEEPALIVE_INTERVAL_S
    max_context_tokens: int | None = API_MAX_CONTEXT_TOKENS
    stalled_client_timeout: float = API_STALLED_CLIENT_TIMEOUT_S
    max_connections: int = API_MAX_CONNECTIONS
    retry_after: float = API_RETRY_AFTER_S
    cors_origins: tuple[str, ...] = ()
    """Origins whose web pages may call the API (`*`: any); none by default."""
    cors_max_age: int = API_CORS_MAX_AGE_S
    allowed_hosts: tuple[str, ...] = ()
    """Names `Host` may give besides loopback names, IP addresses and `host` (`*`: any
    name); against DNS rebinding (`trexo.api.cross_site`)."""
    ollama_port: int | None = None
    """A second listener of the same API on `host`, for Ollama clients (`OLLAMA_PORT`);
    None: none; 0 picks a free port. Both listeners share `max_connections`."""
    api_keys: tuple[str, ...] = attrs.field(default=(), repr=False)
    """With any, every request but `GET /health` must present one (`trexo.api.auth`); none:
    the API is open. Never logged (not in the repr)."""
    tls_cert: Path | None = None
    """With `tls_key`, both listeners serve HTTPS with this certificate chain (PEM)."""
    tls_key: Path | None = None
    max_event_streams: int = API_MAX_EVENT_STREAMS
    events_min_interval: float = API_EVENTS_MIN_INTERVAL_S
    events_retry_ms: int = API_EVENTS_RETRY_MS


# --- peer transport --------------------------------------------------------------------------

DEFAULT_PEER_HOST = "0.0.0.0"
"""Peers must reach each other across the LAN, so the peer port listens on every interface."""
PEER_PORT = 52416
"""The peer (node-to-node websocket) port, next to the API's."""
DEFAULT_NAMESPACE = "trexo"
"""Nodes link only to nodes of the same namespace: several clusters can share a LAN."""
CLUSTER_SECRET_ENV = "TREXO_CLUSTER_SECRET"
"""Environment variable holding the cluster secret (the CLI's `--cluster-secret` wins)."""
PROTOCOL_VERSION = 3
"""Version of the peer protocol (handshake, envelopes and their payloads); peers must agree
exactly. 2: links are encrypted (`trexo.net.secure_channel`), and a node's report lists its
links (`NodeInfo.peers`), which version 1's strict decoder would drop as an unknown field.
3: indirect probes (`trexo.net.probe`), a link-level topic version 2 would count as garbage."""
HEARTBEAT_INTERVAL_S = 0.2
"""A link pings its peer, and judges its silence, this often."""
SUSPECT_AFTER_S = 0.6
"""A peer silent this long (no message, no pong; this node's own stalls not counted) is
suspect: other linked nodes are asked whether they hear it (`trexo.net.probe`)."""
LOST_AFTER_S = 1.8
"""A peer silent this long, heard by no other node either, is lost: its link closes. Longer
than the longest pause a live process makes on a busy machine (1.2 s measured: a 1.2 s
SIGSTOP every 3 s at load 8 on 2 cores declared nodes dead with 0.4 s x 2 pings), and within
2 s of a freeze on a quiet machine (`TransportConfig.frozen_peer_bound`). Both this and
`SUSPECT_AFTER_S` stretch with this node's own local health (`trexo.local_health`)."""
VOUCHED_LOST_AFTER_S = 5.4
"""A peer silent this long on its link to this node is lost even though another node heard
it: the link alone is broken; the nodes link again."""
HANDSHAKE_TIMEOUT_S = 5.0
"""Bound on TCP connect + websocket upgrade + hello/proof/ready; slower is closed."""
SEND_TIMEOUT_S = 5.0
"""Bound on handing one message to a peer's socket; a peer this stuck loses its link."""
CLOSE_TIMEOUT_S = 1.0
"""Bound on a websocket's closing handshake before the TCP connection is just dropped."""
MAX_MESSAGE_BYTES = MAX_FRAME_BYTES
"""A peer message larger than this is dropped (and counts as garbage)."""
HARD_MESSAGE_BYTES_FACTOR = 4
"""trio-websocket buffers a message whole before we see it; past `factor * max_message_bytes`
it closes the link (code 1009) rather than buffer more."""
PEER_MESSAGE_QUEUE = 64
"""Messages trio-websocket buffers per link before its reader (and so its pong replies) waits."""
GARBAGE_LIMIT = 20
"""More bad messages than this from one peer within `GARBAGE_WINDOW_S` disconnects it."""
GARBAGE_WINDOW_S = 10.0
PEER_MAX_HANDSHAKES = 128
"""Incoming connections at most that have not finished the handshake; one more is closed at
once. A handshake costs ~0.5 ms of CPU (a key exchange, an HMAC): this many ready at the same
moment hold the event loop ~60 ms, well inside the heartbeat timeout, so a flood of them
cannot starve established links. A cluster links each pair of nodes once."""
PEER_MAX_HANDSHAKES_PER_HOST = 16
"""The same, per source address: one flooding address cannot take every slot. A node dials
each peer once (twice while two dial each other), and a test cluster on one loopback
address a few nodes at once; 16 leaves room for both."""
PEER_REFUSALS_LOG_INTERVAL_S = 10.0
"""During a flood, refused connections are logged in one line per this long, not one each."""
PEER_HANDSHAKE_MESSAGE_BYTES = 16 * 1024
"""The largest message either side takes before the handshake ends (a larger one closes the
connection, code 1009, unread). A hello lists at most `GOSSIP_DIAL_TARGETS` peers: ~7.5 KB
with the longest ids and addresses, decoded in ~0.2 ms. Without this bound the link's
(`hard_message_bytes`, 64 MiB) applied to anyone who connects: a 16 MB hello held the event
loop ~0.9 s, past the heartbeat timeout, and each admitted connection could buffer 64 MiB."""
GOSSIP_DIAL_TARGETS = 64
"""Addresses at most taken from one gossiped list, and waiting to be dialled: more peers than
a cluster has; the rest of a list is ignored, with a log line."""
GOSSIP_DIAL_RATE = 8.0
"""Dials per second, at most, of nodes heard of through gossip or beacons ..."""
GOSSIP_DIAL_BURST = 16
"""... after a first burst of this many: a new node dials a small cluster's peers at once."""


@attrs.frozen
class TransportConfig:
    """The peer port, the handshake's identity checks, and the limits and timeouts of links."""

    host: str = DEFAULT_PEER_HOST
    port: int = PEER_PORT
    """0 picks a free port; `Transport.run` reports the bound port."""
    namespace: str = DEFAULT_NAMESPACE
    secret: bytes | None = attrs.field(default=None, repr=False)
    """Cluster secret: with one, peers must prove they know it (HMAC challenge-response).
    Never logged (not in the repr) and never sent."""
    protocol_version: int = PROTOCOL_VERSION
    heartbeat_interval: float = HEARTBEAT_INTERVAL_S
    suspect_after: float = SUSPECT_AFTER_S
    lost_after: float = LOST_AFTER_S
    vouched_lost_after: float = VOUCHED_LOST_AFTER_S
    handshake_timeout: float = HANDSHAKE_TIMEOUT_S
    send_timeout: float = SEND_TIMEOUT_S
    close_timeout: float = CLOSE_TIMEOUT_S
    max_message_bytes: int = MAX_MESSAGE_BYTES
    garbage_limit: int = GARBAGE_LIMIT
    garbage_window: float = GARBAGE_WINDOW_S
    message_queue: int = PEER_MESSAGE_QUEUE
    max_handshakes: int = PEER_MAX_HANDSHAKES
    max_handshakes_per_host: int = PEER_MAX_HANDSHAKES_PER_HOST
    handshake_message_bytes: int = PEER_HANDSHAKE_MESSAGE_BYTES
    gossip_dial_targets: int = GOSSIP_DIAL_TARGETS
    dial_rate: float = GOSSIP_DIAL_RATE
    dial_burst: int = GOSSIP_DIAL_BURST

    @property
    def hard_message_bytes(self) -> int:
        """Past this size trio-websocket closes the link instead of handing us the message."""
        return self.max_message_bytes * HARD_MESSAGE_BYTES_FACTOR

    @property
    def frozen_peer_bound(self) -> float:
        """The longest a frozen peer stays linked on a quiet machine (no other node hears
        it): its silence is counted from its last pong, before it froze, and judged every
        `heartbeat_interval`."""
        return self.lost_after + self.heartbeat_interval


# --- discovery -------------------------------------------------------------------------------

DISCOVERY_PORT = 52417
"""UDP port of the multicast beacons."""
MULTICAST_GROUP = "239.255.52.17"
"""An organisation-local (RFC 2365) group: beacons never leave the site."""
MULTICAST_TTL = 1
"""Beacons stay on the local network segment."""
MULTICAST_INTERFACE = "0.0.0.0"
"""The interface beacons go out of and are heard on; 0.0.0.0 lets the kernel choose."""
BEACON_INTERVAL_S = 1.0
"""How often a node announces itself."""
REDIAL_BACKOFF_INITIAL_S = 0.2
"""First pause before re-dialling a static peer that was lost or unreachable."""
REDIAL_BACKOFF_MAX_S = 5.0
REDIAL_BACKOFF_FACTOR = 2.0


@attrs.frozen
class DiscoveryConfig:
    """How a node finds peers: static `--peer HOST:PORT` addresses, and multicast beacons."""

    static_peers: tuple[tuple[str, int], ...] = ()
    multicast: bool = True
    discovery_port: int = DISCOVERY_PORT
    multicast_group: str = MULTICAST_GROUP
    multicast_ttl: int = MULTICAST_TTL
    multicast_interface: str = MULTICAST_INTERFACE
    beacon_interval: float = BEACON_INTERVAL_S
    redial_initial: float = REDIAL_BACKOFF_INITIAL_S
    redial_max: float = REDIAL_BACKOFF_MAX_S
    redial_factor: float = REDIAL_BACKOFF_FACTOR

    def redial_delay(self, attempt: int) -> float:
        """Pause before re-dial number `attempt` (1-based) of one static peer."""
        return min(self.redial_max, self.redial_initial * self.redial_factor ** (attempt - 1))


# --- election --------------------------------------------------------------------------------

ELECTION_BOOT_GRACE_S = 0.3
"""A booting node waits this long for a peer to tell it the cluster's session before it
campaigns; links that come up later than this meet a session of its own (see the election's
solo rule)."""
ELECTION_CAMPAIGN_WINDOW_S = 0.5
"""Longest a campaign waits for a silent peer; it ends as soon as every linked peer answered."""
FORCE_MASTER_SENIORITY = 1 << 40
"""`--force-master`: a seniority no number of won rounds can reach, so the node always wins."""
ELECTION_MAX_CLOCK_STEP = 1024
"""The most a peer's election message may put a clock ahead of the highest this node knows;
past it the message is dropped, and this node moves its own clock up by this much and asks
the sender again. Honest clocks move one per round, so a gap this large means a node that
missed a thousand rounds (or lost its clock file): it catches up a step per exchange, in
milliseconds. A hostile peer moves a node by no more than this per message."""
ELECTION_MAX_CLOCK = (1 << 53) - 1
"""No clock goes past this: its successor is still an integer every peer's JSON decoder
takes (`MAX_JSON_INT_DIGITS`), and a browser reading `/health` holds it exactly. At a step
per message, a peer needs 2**43 messages to get there."""


@attrs.frozen
class ElectionConfig:
    """Timing of the election and the seniority `--force-master` claims."""

    boot_grace: float = ELECTION_BOOT_GRACE_S
    campaign_window: float = ELECTION_CAMPAIGN_WINDOW_S
    force_master_seniority: int = FORCE_MASTER_SENIORITY
    max_clock_step: int = ELECTION_MAX_CLOCK_STEP
    max_clock: int = ELECTION_MAX_CLOCK


# --- model downloads (Hugging Face) -----------------------------------------------------------

HF_ENDPOINT_ENV = "HF_ENDPOINT"
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
HF_OFFLINE_ENV = "HF_HUB_OFFLINE"
HUB_REQUEST_TIMEOUT_S = 10.0
"""Bound on one metadata request to the hub (a repo's listing, its config.json)."""
DOWNLOAD_REPORT_INTERVAL_S = 1.0
"""A download's progress is reported (a fact in the cluster state) at most this often."""
DOWNLOAD_PROGRESS_INTERVAL_S = 0.2
"""The download process tells its node how far it got at most this often."""
DOWNLOAD_CHUNK_BYTES = 256 * 1024
"""Bytes read per chunk: a progress step, and the most a killed download loses (each chunk
also costs a write and a hash update: ~0.1 ms, nothing at any realistic rate)."""
DOWNLOAD_RETRY_INITIAL_S = 1.0
"""After a failure that may pass (network down), the first retry waits this long ..."""
DOWNLOAD_RETRY_MAX_S = 30.0
"""... each next one twice as long, up to this."""
DOWNLOAD_STOP_GRACE_S = 1.0
"""A download no one needs any more is sent SIGTERM, then SIGKILL after this."""
DOWNLOAD_DISK_MARGIN_BYTES = 64 * 1024 * 1024
"""Free space a download leaves on its disk beyond the files it writes."""
DOWNLOAD_RATE_WINDOW_S = 5.0
"""The rate (and so the ETA) is the average over this much recent time."""
MAX_HUB_JSON_BYTES = 32 * 1024 * 1024
"""The largest JSON from a hub that is read into memory: a repository's listing, its
`config.json` and its weight index. The largest real ones are far smaller (DeepSeek-V3's
index of 91,000 tensors: 9 MB; a listing of thousands of files: a few MB); larger is refused
before it is fetched or read, and a transfer stops at the size the listing announced."""
HUB_SMALL_ANSWER_TIMEOUT_S = 30.0
"""A listing from the hub that has not arrived whole in this long is `HubUnreachable`: each
silence is bounded by `HUB_REQUEST_TIMEOUT_S`, this bounds a hub that drips its answer (a
real listing of thousands of files takes well under a second)."""
DOWNLOAD_MAX_CORRUPT_ATTEMPTS = 4
"""A file whose content differs from its listing (hash, size, a body longer than listed)
this many times in a row is a failed download, not retried: a dropped connection is resumed
inside one attempt, so repeated corruption is a hub sending the wrong bytes."""
CATALOG_SCAN_THREADS = 1
"""Worker threads scanning the Hugging Face cache for the catalog: scans run one after the
other anyway, and a slow disk then holds one thread, no other kind of work's."""
CATALOG_RESCAN_INTERVAL_S = 2.0
"""How often the catalog looks (in a worker thread) whether the Hugging Face cache changed;
a model fetched by another program shows in listings within this. A look when nothing
changed costs a few `stat`s per cached model."""


def default_hub_cache() -> Path:
    """The Hugging Face cache huggingface_hub and mlx-lm use: `$HF_HUB_CACHE`, else
    `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache).expanduser()
    if home := os.environ.get("HF_HOME"):
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def env_flag(name: str) -> bool:
    """An environment variable set to a true value (1, true, yes, on), as huggingface_hub
    reads its flags."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@attrs.frozen
class HubConfig:
    """Where models come from and go to. The token (`HF_TOKEN`) is never part of it: the
    download process reads it from its environment, so it appears in no state or log."""

    cache_dir: Path = attrs.field(factory=default_hub_cache, converter=Path)
    endpoint: str = attrs.field(
        factory=lambda: os.environ.get(HF_ENDPOINT_ENV) or DEFAULT_HF_ENDPOINT
    )
    offline: bool = attrs.field(factory=lambda: env_flag(HF_OFFLINE_ENV))
    request_timeout: float = HUB_REQUEST_TIMEOUT_S
    report_interval: float = DOWNLOAD_REPORT_INTERVAL_S
    progress_interval: float = DOWNLOAD_PROGRESS_INTERVAL_S
    chunk_bytes: int = DOWNLOAD_CHUNK_BYTES
    retry_initial: float = DOWNLOAD_RETRY_INITIAL_S
    retry_max: float = DOWNLOAD_RETRY_MAX_S
    stop_grace: float = DOWNLOAD_STOP_GRACE_S
    disk_margin: int = DOWNLOAD_DISK_MARGIN_BYTES
    rate_window: float = DOWNLOAD_RATE_WINDOW_S
    max_json_bytes: int = MAX_HUB_JSON_BYTES
    max_corrupt_attempts: int = DOWNLOAD_MAX_CORRUPT_ATTEMPTS

    def retry_delay(self, attempt: int) -> float:
        """Seconds before retry number `attempt` (1, 2, ...)."""
        return float(min(self.retry_max, self.retry_initial * 2 ** max(0, attempt - 1)))


# --- the node --------------------------------------------------------------------------------


@attrs.frozen
class NodeConfig:
    """Everything a node needs to run; `trexo run`'s options end up here."""

    paths: Paths = Paths()
    api: ApiConfig = ApiConfig()
    transport: TransportConfig = TransportConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    election: ElectionConfig = ElectionConfig()
    master: MasterConfig = MasterConfig()
    """The master's knobs, when this node is the master."""
    force_master: bool = False
    """Claim top seniority: this node wins every election it takes part in."""
    runner: RunnerConfig = RunnerConfig()
    restart: RestartPolicy = RestartPolicy()
    """How the session supervisor restarts a crashed generation."""
    runner_restart: RestartPolicy = RUNNER_RESTART_POLICY
    """How a worker restarts a runner that died (it never gives up; it backs off)."""
    default_model: ModelRef | None = None
    """Placed once per session if the cluster has no instance of it (None: place nothing)."""
    extra_models: tuple[ModelRef, ...] = ()
    """Local models this node offers besides the built-in demo models."""
    runner_env: dict[str, str] = attrs.field(factory=dict)
    hub: HubConfig = attrs.field(factory=HubConfig)
    """Where Hugging Face models come from (endpoint, offline) and go to (the cache)."""
