"""Runner process entry point: `python -m trexo.runner --ipc-fd N`.

Started only by `RunnerSupervisor`. Ignores SIGINT (a terminal's Ctrl-C reaches the whole
process group; the node drives the orderly shutdown) and exits on Shutdown or EOF.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import socket
import sys

from trexo.config import COMPUTE_JOIN_TIMEOUT_S, MAX_FRAME_BYTES
from trexo.runner.exit_codes import EXIT_USAGE
from trexo.runner.hooks import hooks_from_env

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trexo.runner", description=__doc__)
    parser.add_argument("--ipc-fd", type=int, required=True, help="inherited socket fd")
    parser.add_argument("--runner-id", default="runner")
    parser.add_argument("--max-frame-bytes", type=int, default=MAX_FRAME_BYTES)
    parser.add_argument("--compute-join-timeout", type=float, default=COMPUTE_JOIN_TIMEOUT_S)
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        hooks = hooks_from_env()
    except (SystemExit, ValueError) as exc:
        print(f"trexo.runner: {exc}", file=sys.stderr)
        return EXIT_USAGE
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hooks.ignore_shutdown:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=args.log_level, format=LOG_FORMAT, stream=sys.stderr)

    from trexo.engine.blas import setup_blas

    setup_blas()  # before anything imports mlx; OPENBLAS_NUM_THREADS comes from the parent

    import trio

    from trexo.runner.serve import serve_runner

    sock = socket.socket(fileno=args.ipc_fd)
    serve = functools.partial(
        serve_runner,
        sock,
        hooks=hooks,
        max_frame_bytes=args.max_frame_bytes,
        compute_join_timeout=args.compute_join_timeout,
    )
    code = trio.run(serve)
    # Everything is joined and closed; skip interpreter teardown (tens of ms with mlx and
    # transformers loaded) so that the memory is back to the system at once.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
