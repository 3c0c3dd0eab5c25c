"""The `trexo` command line: `trexo run` starts a node; `trexo demo-model` builds a demo model."""

from __future__ import annotations

import argparse
import functools
import ipaddress
import json
import logging
import logging.handlers
import os
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from trexo import __version__
from trexo.config import Paths
from trexo.types.ids import InstanceId
from trexo.types.models import ModelRef

if TYPE_CHECKING:
    from trexo.config import HubConfig, NodeConfig

log = logging.getLogger("trexo")

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
MIB = 1024 * 1024
EXIT_FORCED = 130
"""A second Ctrl-C: leave at once (runners see EOF on their sockets and exit by themselves)."""
DEMO_PROMPT = "Hello! What can you do?"
DEMO_MAX_TOKENS = 64
"""The ready line's example stops here (absent, max_tokens is all the context leaves)."""
QUIET_LOGGERS = ("httpx", "httpx2", "huggingface_hub")
API_KEY_PLACEHOLDER = "YOUR_API_KEY"
"""Stands for the key in the ready line's curl command: keys are never printed."""
_stopped_cleanly = False
"""Set once the node has stopped in order (a late Ctrl-C after that changes nothing)."""


def build_parser() -> argparse.ArgumentParser:
    from trexo.config import API_MAX_CONNECTIONS, API_PORT, DEFAULT_API_HOST, OLLAMA_PORT
    from trexo.engine.demo_model import DEFAULT_DEMO_SIZE, DEMO_MODEL_NAMES

    parser = argparse.ArgumentParser(
        prog="trexo",
        description="Run large language models across a cluster of ordinary machines.",
    )
    parser.add_argument("--version", action="version", version=f"trexo {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="start a node and serve the OpenAI-compatible API",
        description=(
            "Start a node: elect a master, place the model, serve the OpenAI-compatible API. "
            "With no model option it builds (once) and places the built-in demo model."
        ),
    )
    model = run.add_mutually_exclusive_group()
    model.add_argument(
        "--model",
        metavar="PATH_OR_REPO",
        help=(
            "a local mlx-lm model directory, or a Hugging Face repo id "
            "(mlx-community/Qwen3-0.6B-4bit) that each node downloads its part of"
        ),
    )
    model.add_argument(
        "--demo-size",
        choices=DEMO_MODEL_NAMES,
        default=DEFAULT_DEMO_SIZE,
        help="which built-in demo model to place (default: %(default)s)",
    )
    model.add_argument("--no-model", action="store_true", help="place nothing; serve the API only")
    run.add_argument(
        "--api-host",
        default=DEFAULT_API_HOST,
        help="API bind address (default: %(default)s; 0.0.0.0 exposes it to the LAN)",
    )
    run.add_argument(
        "--api-port",
        type=int,
        default=API_PORT,
        help="API port (default: %(default)s; 0 picks a free one)",
    )
    run.add_argument(
        "--ollama-port",
        type=_non_negative_int,
        default=None,
        metavar="PORT",
        help=f"also serve the API on PORT, for Ollama clients ({OLLAMA_PORT} is their default; "
        "0 picks a free one; default: off)",
    )
    run.add_argument(
        "--api-max-connections",
        type=_positive_int,
        default=API_MAX_CONNECTIONS,
        metavar="N",
        help="HTTP connections served at once; more get 503 (default: %(default)s, "
        "lowered to fit the file descriptor limit)",
    )
    run.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        type=_origin,
        metavar="ORIGIN",
        help="let web pages of ORIGIN (https://host[:port], or * for any) call the API "
        "(repeatable; default: no cross-origin access)",
    )
    run.add_argument(
        "--api-allowed-host",
        action="append",
        default=[],
        type=_host_name,
        metavar="NAME",
        help="accept requests that name the node NAME in their Host header, besides "
        "localhost, *.localhost, *.internal, IP addresses, --api-host and the machine's name "
        "(repeatable; * accepts any name and gives up the defence against DNS rebinding)",
    )
    _add_security_options(run)
    _add_limit_options(run)
    _add_hub_options(run)
    _add_cluster_options(run)
    _add_common(run)

    download = commands.add_parser(
        "download",
        help="download a Hugging Face model (with a progress bar) and exit",
        description=(
            "Download every file of a Hugging Face model into the Hugging Face cache, where "
            "trexo (and mlx-lm) find it. An interrupted download resumes where it stopped."
        ),
    )
    download.add_argument("repo", help="the repo id, e.g. mlx-community/Qwen3-0.6B-4bit")
    download.add_argument(
        "--revision", default="main", help="branch, tag or commit (default: %(default)s)"
    )
    _add_hub_options(download)
    _add_common(download)

    demo = commands.add_parser(
        "demo-model",
        help="build the deterministic demo model and print its directory",
        description="Build (once) a deterministic demo model; the same seed gives identical bytes.",
    )
    demo.add_argument(
        "--size",
        choices=DEMO_MODEL_NAMES,
        default=DEFAULT_DEMO_SIZE,
        help="tiny (0.85 M parameters) or small (20 M) (default: %(default)s)",
    )
    demo.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the random weights; the same seed gives identical files (default: 0)",
    )
    demo.add_argument(
        "--arch",
        metavar="NAME",
        help=(
            "build the model zoo's NAME instead: a tiny random-weight model of that mlx-lm "
            "architecture (qwen3, gemma3_text, deepseek_v3, ...); `--arch list` lists them"
        ),
    )
    demo.add_argument(
        "--quantized",
        action="store_true",
        help="with --arch: quantized to 4 bits by mlx-lm's own quantization",
    )
    _add_common(demo)
    return parser


def _add_security_options(parser: argparse.ArgumentParser) -> None:
    from trexo.config import API_KEY_ENV

    security = parser.add_argument_group(
        "API keys and TLS",
        "With a key, every request but GET /health and the dashboard's own files must carry one "
        "(Authorization: Bearer KEY, "
        "or x-api-key: KEY); a missing or wrong key gets 401. With a certificate and its key, "
        "the API serves HTTPS.",
    )
    security.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help=f"accept this API key (repeatable; also ${API_KEY_ENV}; default: no key needed)",
    )
    security.add_argument(
        "--api-key-file",
        type=Path,
        metavar="PATH",
        help="accept every key in this file (one per line; blank lines and # comments skipped)",
    )
    security.add_argument(
        "--api-tls-cert", type=Path, metavar="PEM", help="certificate chain for HTTPS"
    )
    security.add_argument("--api-tls-key", type=Path, metavar="PEM", help="its private key")


def _add_hub_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--offline",
        action="store_true",
        help="use only models on disk, never the network (also: HF_HUB_OFFLINE=1)",
    )


def _add_cluster_options(parser: argparse.ArgumentParser) -> None:
    from trexo.config import (
        CLUSTER_SECRET_ENV,
        DEFAULT_NAMESPACE,
        DEFAULT_PEER_HOST,
        DISCOVERY_PORT,
        PEER_PORT,
    )

    cluster = parser.add_argument_group(
        "cluster",
        "Nodes find each other by UDP multicast on the LAN and by --peer addresses, link over "
        "the peer port, and elect one master. A node alone is a cluster of one.",
    )
    cluster.add_argument(
        "--peer",
        action="append",
        default=[],
        type=_host_port,
        metavar="HOST:PORT",
        help="a peer to link to (repeatable); peers of peers are found by themselves",
    )
    cluster.add_argument(
        "--peer-host",
        default=DEFAULT_PEER_HOST,
        help="peer port bind address (default: %(default)s)",
    )
    cluster.add_argument(
        "--peer-port", type=int, default=PEER_PORT, help="peer port (default: %(default)s)"
    )
    cluster.add_argument(
        "--discovery-port",
        type=int,
        default=DISCOVERY_PORT,
        help="UDP multicast discovery port (default: %(default)s)",
    )
    cluster.add_argument(
        "--no-multicast", action="store_true", help="find peers through --peer only"
    )
    cluster.add_argument(
        "--namespace",
        default=DEFAULT_NAMESPACE,
        help="only nodes of the same namespace form a cluster (default: %(default)s)",
    )
    cluster.add_argument(
        "--cluster-secret",
        default=os.environ.get(CLUSTER_SECRET_ENV),
        help="peers must prove they know it (HMAC), and it keys the links' encryption, so a "
        f"man in the middle can neither join nor read; default ${CLUSTER_SECRET_ENV}",
    )
    cluster.add_argument(
        "--force-master", action="store_true", help="this node always wins elections"
    )
    _add_history_options(parser)


def _add_history_options(parser: argparse.ArgumentParser) -> None:
    from trexo.config import RETAINED_LOG_BYTES, RETAINED_SESSIONS, SNAPSHOT_EVERY_EVENTS

    history = parser.add_argument_group(
        "history",
        "The master logs the cluster's state changes (never prompts) to <data dir>/events, "
        "snapshots the state every so many events and keeps only the snapshot and the "
        "events after it, in memory and on disk.",
    )
    history.add_argument(
        "--snapshot-every",
        type=_positive_int,
        default=SNAPSHOT_EVERY_EVENTS,
        metavar="N",
        help="events between two snapshots (default: %(default)s)",
    )
    history.add_argument(
        "--keep-sessions",
        type=_positive_int,
        default=RETAINED_SESSIONS,
        metavar="N",
        help="sessions whose logs are kept on disk, the current one counted (default: %(default)s)",
    )
    history.add_argument(
        "--keep-log-mib",
        type=_non_negative_int,
        default=RETAINED_LOG_BYTES // MIB,
        metavar="MIB",
        help="at most this much of them; the oldest go first (default: %(default)s)",
    )
    history.add_argument(  # tests kill a node in this window
        "--test-snapshot-pause", type=float, default=0.0, help=argparse.SUPPRESS
    )


def _add_limit_options(parser: argparse.ArgumentParser) -> None:
    from trexo.config import (
        API_STALLED_CLIENT_TIMEOUT_S,
        DEFAULT_MAX_BATCH,
        DEFAULT_PREFILL_STEP_TOKENS,
        PROMPT_CACHE_BYTES,
    )

    limits = parser.add_argument_group(
        "limits",
        "What one request may take. A request that does not fit is refused with a 400 "
        "before it reaches the master.",
    )
    limits.add_argument(
        "--max-context-tokens",
        type=_positive_int,
        default=None,
        metavar="N",
        help="cap prompt + max_tokens below the model's own context (default: the model's)",
    )
    limits.add_argument(
        "--stalled-client-timeout",
        type=float,
        default=API_STALLED_CLIENT_TIMEOUT_S,
        metavar="S",
        help="cancel a stream whose client has not read for S seconds (default: %(default)s)",
    )
    limits.add_argument(
        "--prefill-step",
        type=_positive_int,
        default=DEFAULT_PREFILL_STEP_TOKENS,
        metavar="N",
        help="prompt tokens prefilled per step; a cancel takes effect between steps, and "
        "the streams beside a long prompt wait for one such chunk per step "
        "(default: %(default)s)",
    )
    limits.add_argument(
        "--max-batch",
        type=_positive_int,
        default=DEFAULT_MAX_BATCH,
        metavar="N",
        help="generations a runner steps together; more wait in its queue (default: %(default)s)",
    )
    limits.add_argument(
        "--prompt-cache-mib",
        type=_non_negative_int,
        default=PROMPT_CACHE_BYTES // MIB,
        metavar="MIB",
        help="bound of each runner's prompt cache, which lets a conversation's next turn "
        "skip its history (0: no cache; default: %(default)s)",
    )


def _non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(text)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _origin(text: str) -> str:
    from trexo.api.cors import normalize_origin

    try:
        return normalize_origin(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _host_name(text: str) -> str:
    from trexo.api.cross_site import normalize_host_name

    try:
        return normalize_host_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="models, logs and node id (default: $TREXO_HOME or ~/.local/share/trexo)",
    )
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    verbosity.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")


def setup_logging(args: argparse.Namespace, log_file: Path | None = None) -> None:
    """Log to stderr, and to `log_file` too (rotated) when given."""
    from trexo.config import NODE_LOG_BACKUPS, NODE_LOG_MAX_BYTES

    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr)
    for chatty in QUIET_LOGGERS:  # a line per HTTP request to the hub
        logging.getLogger(chatty).setLevel(max(level, logging.WARNING))
    if log_file is None:
        return
    try:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(
            log_file, maxBytes=NODE_LOG_MAX_BYTES, backupCount=NODE_LOG_BACKUPS
        )
    except OSError as exc:
        log.warning("cannot write the node log %s (%s); logging to stderr only", log_file, exc)
        return
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.getLogger().addHandler(handler)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    setup_logging(args, _paths(args).node_log if args.command == "run" else None)
    if args.command == "demo-model":
        return demo_model_command(args)
    if args.command == "download":
        return download_command(args)
    return run_command(args)


def _paths(args: argparse.Namespace) -> Paths:
    return Paths(args.data_dir) if args.data_dir else Paths()


def demo_model_command(args: argparse.Namespace) -> int:
    from trexo.engine.demo_model import ensure_demo_model

    if args.arch is not None:
        return zoo_model_command(args)
    if args.quantized:
        print("trexo demo-model: --quantized goes with --arch", file=sys.stderr)
        return 2
    print(ensure_demo_model(_paths(args).models_dir, args.size, args.seed))
    return 0


def zoo_model_command(args: argparse.Namespace) -> int:
    from trexo.engine.zoo import ensure_zoo_model
    from trexo.engine.zoo_archs import ZOO_ARCHS

    if args.arch == "list":
        width = max(map(len, ZOO_ARCHS))
        for name, arch in ZOO_ARCHS.items():
            print(f"{name:<{width}}  {arch.about}")
        return 0
    if args.arch not in ZOO_ARCHS:
        print(
            f"trexo demo-model: no architecture {args.arch!r} in the zoo "
            "(`trexo demo-model --arch list` lists them)",
            file=sys.stderr,
        )
        return 2
    models_dir = _paths(args).models_dir
    print(ensure_zoo_model(models_dir, args.arch, args.seed, quantized=args.quantized))
    return 0


def run_command(args: argparse.Namespace) -> int:
    from trexo import catalog
    from trexo.config import (
        API_KEY_ENV,
        ApiConfig,
        DiscoveryConfig,
        MasterConfig,
        NodeConfig,
        RunnerConfig,
        TransportConfig,
    )
    from trexo.errors import HubError, ModelNotFound
    from trexo.fd_limit import raise_fd_limit

    hub = _hub_config(args)
    extra = []
    default = None
    try:
        api_keys = read_api_keys(args.api_key, args.api_key_file, os.environ.get(API_KEY_ENV))
        tls_cert, tls_key = check_tls(args.api_tls_cert, args.api_tls_key)
    except ValueError as exc:
        print(f"trexo: {exc}", file=sys.stderr)
        return 2
    try:
        if args.model is not None:
            default = _named_model(args.model, hub)
            if default.hub_revision is None:
                extra.append(default)
        elif not args.no_model:
            default = catalog.demo_model_ref(args.demo_size)
    except (ModelNotFound, HubError) as exc:
        print(f"trexo: {exc}", file=sys.stderr)
        return 2
    config = NodeConfig(
        paths=_paths(args),
        api=ApiConfig(
            host=args.api_host,
            port=args.api_port,
            ollama_port=args.ollama_port,
            max_connections=args.api_max_connections,
            cors_origins=tuple(args.cors_origin),
            allowed_hosts=tuple(args.api_allowed_host),
            max_context_tokens=args.max_context_tokens,
            stalled_client_timeout=args.stalled_client_timeout,
            api_keys=api_keys,
            tls_cert=tls_cert,
            tls_key=tls_key,
        ),
        runner=RunnerConfig(
            prefill_step=args.prefill_step,
            max_batch=args.max_batch,
            prompt_cache_bytes=args.prompt_cache_mib * MIB,
        ),
        transport=TransportConfig(
            host=args.peer_host,
            port=args.peer_port,
            namespace=args.namespace,
            secret=args.cluster_secret.encode() if args.cluster_secret else None,
        ),
        discovery=DiscoveryConfig(
            static_peers=tuple(args.peer),
            multicast=not args.no_multicast,
            discovery_port=args.discovery_port,
        ),
        master=MasterConfig(
            snapshot_every_events=args.snapshot_every,
            retained_sessions=args.keep_sessions,
            retained_log_bytes=args.keep_log_mib * MIB,
            test_snapshot_pause=args.test_snapshot_pause,
        ),
        force_master=args.force_master,
        default_model=default,
        extra_models=tuple(extra),
        hub=hub,
    )
    for warning in startup_warnings(config):
        log.warning("%s", warning)
    # Process-wide, so here and not in `Node`: every client, runner and peer holds an fd.
    raise_fd_limit()
    try:
        code = trio.run(functools.partial(run_node_until_signalled, config))
    except KeyboardInterrupt:
        # trio re-delivers a Ctrl-C that was still queued when the node finished stopping.
        if not _stopped_cleanly:
            raise
        code = 0
    # Stopped: a second Ctrl-C from here on has nothing left to force, and Python's own
    # handler would turn it into a traceback and a death by SIGINT during the teardown.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    leave_past_abandoned_threads(code)
    return code


def leave_past_abandoned_threads(code: int) -> None:
    """Exit now, with `code`, if worker threads are still running after the node stopped.

    Some blocking calls cannot be interrupted, so a bounded wait abandons them: a hub
    look-up that drips its answer, a chat template between two budget checks. Every service
    has stopped by now, but the interpreter's teardown would stop those threads mid-call,
    and one inside native code then aborts the whole process (SIGABRT, "terminate called
    without an active exception") after a clean stop. Nothing is left to clean up: flush
    what was written and leave.
    """
    if threading.active_count() <= 1:
        return
    log.info("leaving %d abandoned worker thread(s) behind", threading.active_count() - 1)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def read_api_keys(
    flags: Sequence[str], key_file: Path | None, env_key: str | None
) -> tuple[str, ...]:
    """Every API key given: `--api-key`s, the lines of `--api-key-file`, `$TREXO_API_KEY`.
    `ValueError` for a file that cannot be read or holds none, or a blank key."""
    keys = list(flags)
    if key_file is not None:
        try:
            lines = key_file.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--api-key-file {key_file}: cannot read it ({exc})") from None
        from_file = [line.strip() for line in lines]
        from_file = [key for key in from_file if key and not key.startswith("#")]
        if not from_file:
            raise ValueError(f"--api-key-file {key_file}: no key in it")
        keys += from_file
    if env_key:
        keys.append(env_key)
    if any(not key.strip() for key in keys):
        raise ValueError("an API key is blank")
    return tuple(dict.fromkeys(key.strip() for key in keys))


def check_tls(cert: Path | None, key: Path | None) -> tuple[Path | None, Path | None]:
    """The certificate and key, checked now (a clear error at start, not a traceback at the
    first connection); `ValueError` if only one is given or they do not load."""
    if cert is None and key is None:
        return None, None
    if cert is None or key is None:
        raise ValueError("--api-tls-cert and --api-tls-key go together")
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"--api-tls-cert {cert} / --api-tls-key {key}: {exc}") from None
    return cert, key


def _hub_config(args: argparse.Namespace) -> HubConfig:
    from trexo.config import HubConfig

    return HubConfig(offline=True) if args.offline else HubConfig()


def _named_model(name: str, hub: HubConfig) -> ModelRef:
    """`--model`: a local directory, else a Hugging Face repo id resolved now (pinned to its
    commit; if the hub cannot be reached, by name: the node resolves it when it can)."""
    from trexo import catalog
    from trexo.errors import HubUnreachable, ModelNotFound
    from trexo.hub.listing import is_repo_id
    from trexo.hub.resolve import resolve_model
    from trexo.types.models import DEFAULT_HUB_REVISION, HubRevision

    path = Path(name).expanduser()
    if path.is_dir() or not is_repo_id(name):
        if not path.is_dir():
            raise ModelNotFound(
                f"--model {name}: neither a model directory nor a Hugging Face repo id (org/name)"
            )
        return catalog.local_model_ref(path)
    try:
        return resolve_model(name, hub)
    except HubUnreachable as exc:
        log.warning("%s; the node places %s once the hub answers", exc, name)
        return ModelRef(name, HubRevision(name, DEFAULT_HUB_REVISION).source, 0)


def download_command(args: argparse.Namespace) -> int:
    from trexo.errors import HubError

    try:
        return trio.run(functools.partial(_download, args.repo, args.revision, args))
    except HubError as exc:
        print(f"trexo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("trexo: interrupted; the next download resumes where this one stopped")
        return EXIT_FORCED


async def _download(repo_id: str, revision: str, args: argparse.Namespace) -> int:
    from rich.console import Console

    from trexo.hub.downloads import Downloads
    from trexo.hub.progress_view import show_download
    from trexo.hub.resolve import resolve_model
    from trexo.identity import load_or_create_node_id

    hub = _hub_config(args)
    paths = _paths(args)
    model = await trio.to_thread.run_sync(
        functools.partial(resolve_model, repo_id, hub, revision=revision)
    )
    downloads = Downloads(load_or_create_node_id(paths.data_dir), hub, log_dir=paths.logs_dir)
    async with trio.open_nursery() as nursery:
        await nursery.start(downloads.run)
        nursery.start_soon(show_download, downloads, model.model_id, Console(stderr=True))
        snapshot = await downloads.fetch(model)
        nursery.cancel_scope.cancel()
    print(snapshot)
    return 0


def startup_warnings(config: NodeConfig) -> list[str]:
    """What a user should know before trusting this node: exposure, and a missing fast BLAS."""
    from trexo.engine.blas import missing_openblas_warning

    warnings = [missing_openblas_warning()]
    if config.transport.secret is None and not _is_loopback(config.transport.host):
        warnings.append(
            f"the peer port listens on {config.transport.host}:{config.transport.port} with no "
            "cluster secret: links are encrypted against eavesdroppers, but any machine that "
            "reaches it can join the cluster, be elected master and see every prompt, and an "
            "active attacker between two nodes can read their link. To close it: "
            "--cluster-secret S (or $TREXO_CLUSTER_SECRET), or --peer-host 127.0.0.1 "
            "--no-multicast for a single machine"
        )
    api = config.api
    if not _is_loopback(api.host):
        if not api.api_keys:
            warnings.append(
                f"the API listens on {api.host}:{api.port} with no API key: anyone who reaches "
                "it can use the models and place and delete instances. To close it: "
                "--api-key KEY (or $TREXO_API_KEY, or --api-key-file PATH)"
            )
        elif api.tls_cert is None:
            warnings.append(
                f"the API listens on {api.host}:{api.port} without TLS: API keys, prompts and "
                "answers cross the network in clear text. Add --api-tls-cert and --api-tls-key"
            )
    return [w for w in warnings if w is not None]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a hostname: it may resolve to anything


async def run_node_until_signalled(config: NodeConfig) -> int:
    """Run the node until SIGINT/SIGTERM; a second signal forces exit."""
    from trexo.node import Node

    keyed = bool(config.api.api_keys)
    node = Node(
        config,
        on_model_ready=functools.partial(_print_ready, keyed=keyed),
        on_model_failed=_print_failed,
    )
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            node_scope = trio.CancelScope()

            async def stop_on_signals() -> None:
                async for signum in signals:
                    if node_scope.cancel_called:
                        print("trexo: forced exit", file=sys.stderr, flush=True)
                        os._exit(EXIT_FORCED)
                    log.info("%s: shutting down (again to force)", signal.Signals(signum).name)
                    node_scope.cancel()

            nursery.start_soon(stop_on_signals)
            with node_scope:
                started = await nursery.start(node.run)
                if started.ollama_url is not None:
                    print(f"trexo: Ollama API also on {started.ollama_url}", flush=True)
                default = config.default_model
                if default is not None and default.hub_revision is not None:
                    from rich.console import Console

                    from trexo.hub.progress_view import show_download

                    console = Console(stderr=True)
                    nursery.start_soon(show_download, node.downloads, default.model_id, console)
                if config.default_model is None:
                    await node.wait_joined()  # so that a placement right after it works
                    print(f"trexo is ready: API on {started.api_url} (no model placed)", flush=True)
                await trio.sleep_forever()
            nursery.cancel_scope.cancel()
        global _stopped_cleanly
        _stopped_cleanly = True  # before leaving the receiver, which re-delivers queued signals
    log.info("node stopped")
    return 0


def ready_message(api_url: str, model_id: str, *, keyed: bool = False) -> str:
    """The ready line, with a curl command that works as printed (with an API key: once the
    key is put in; the key itself is never printed)."""
    body = {
        "model": model_id,
        "messages": [{"role": "user", "content": DEMO_PROMPT}],
        "max_tokens": DEMO_MAX_TOKENS,
        "stream": True,
    }
    curl = shlex.join(
        [
            "curl",
            "-N",
            f"{api_url}/v1/chat/completions",
            "-H",
            "Content-Type: application/json",
            *(["-H", f"Authorization: Bearer {API_KEY_PLACEHOLDER}"] if keyed else []),
            "-d",
            json.dumps(body),
        ]
    )
    return f"trexo is ready: model {model_id} is served on {api_url}\n  try: {curl}"


def _print_ready(
    model: ModelRef, instance_id: InstanceId, api_url: str, *, keyed: bool = False
) -> None:
    del instance_id
    print(ready_message(api_url, model.model_id, keyed=keyed), flush=True)


def failed_message(api_url: str, model_id: str, reason: str) -> str:
    return f"trexo is up: API on {api_url} but model {model_id} cannot be served: {reason}"


def _print_failed(model: ModelRef, reason: str, api_url: str) -> None:
    print(failed_message(api_url, model.model_id, reason), flush=True)


if __name__ == "__main__":
    sys.exit(main())
