"""Running this process out of file descriptors for real, for a bounded block of a test."""

from __future__ import annotations

import errno
import gc
import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager

HOG_SOFT_LIMIT = 4096
"""The soft limit is lowered to this (if higher) first, so that using every descriptor up
takes a few milliseconds, not a million opens."""


@contextmanager
def exhausted_fds(spare: int = 0) -> Iterator[None]:
    """Open /dev/null until `open` fails with EMFILE, then free `spare` descriptors; inside
    the block every further open beyond those fails. All is given back on exit."""
    # Garbage that holds a descriptor (an earlier test's unclosed HTTP client) would free it
    # whenever the collector runs, mid-block: collect it first.
    gc.collect()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, HOG_SOFT_LIMIT), hard))
    held: list[int] = []
    try:
        while True:
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                if exc.errno != errno.EMFILE:
                    raise
                break
        for _ in range(spare):
            os.close(held.pop())
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
