"""`python fd_hog_node.py run ARGS...`: a real `trexo run` that can be made to run out of
file descriptors. On SIGUSR1 it opens /dev/null until `open` fails with EMFILE, and says
so on stdout; on SIGUSR2 it closes them again. Everything else is the node as shipped.

The soft and hard limits are first set to `HOG_FD_LIMIT`, so that using every descriptor
up is quick and the node's own raise of its soft limit (to the hard one) changes nothing.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import sys
from types import FrameType

HOG_FD_LIMIT = 1024
HOGGED = "fd hog: holding"
RELEASED = "fd hog: released"

_held: list[int] = []


def hog(signum: int, frame: FrameType | None) -> None:
    while True:
        try:
            _held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            if exc.errno != errno.EMFILE:
                raise
            break
    print(f"{HOGGED} {len(_held)} descriptors", flush=True)  # stdout is open already


def release(signum: int, frame: FrameType | None) -> None:
    while _held:
        os.close(_held.pop())
    print(RELEASED, flush=True)


def main() -> int:
    resource.setrlimit(resource.RLIMIT_NOFILE, (HOG_FD_LIMIT, HOG_FD_LIMIT))
    signal.signal(signal.SIGUSR1, hog)
    signal.signal(signal.SIGUSR2, release)
    from trexo.cli import main as trexo_main

    return trexo_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
