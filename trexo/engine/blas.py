"""Load a fast BLAS into the process before MLX does.

`mlx[cpu]` on Linux links a bundled reference BLAS that is ~30x slower than OpenBLAS for float32
GEMM. The dynamic linker binds `cblas_*` to the first library in the global scope that exports
them, so loading Debian's OpenBLAS (`libopenblas0-pthread`) with `RTLD_GLOBAL` *before*
`mlx.core` is imported makes MLX use it. Afterwards it is too late: the symbols are bound.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

OPENBLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"
OPENBLAS_SONAME = "libopenblas.so.0"
OPENBLAS_CANDIDATE_DIRS = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread",
    "/usr/lib/arm-linux-gnueabihf/openblas-pthread",
    "/usr/lib/powerpc64le-linux-gnu/openblas-pthread",
    "/usr/lib/riscv64-linux-gnu/openblas-pthread",
    "/usr/lib/s390x-linux-gnu/openblas-pthread",
    "/usr/lib64",
    "/usr/lib",
)
"""Debian/Ubuntu multiarch dirs first, then the flat layouts of other distributions."""

OPENBLAS_INSTALL_HINT = "apt-get install libopenblas0-pthread"
"""What a Debian/Ubuntu user runs to get the OpenBLAS `find_openblas` looks for."""

_loaded: ctypes.CDLL | None = None
_loaded_path: str | None = None


def find_openblas() -> str | None:
    """The path (or soname) of an OpenBLAS shared library on this machine, or None."""
    for directory in OPENBLAS_CANDIDATE_DIRS:
        candidate = Path(directory) / OPENBLAS_SONAME
        if candidate.exists():
            return str(candidate)
    # find_library returns a soname the dynamic loader resolves through its cache.
    return ctypes.util.find_library("openblas")


def missing_openblas_warning() -> str | None:
    """A warning for the node's log when MLX would run on its slow reference BLAS, else None.

    The node says it once at start; its runners then only log at debug level.
    """
    if sys.platform != "linux" or find_openblas() is not None:
        return None
    return (
        "no OpenBLAS found: MLX's CPU backend falls back to its reference BLAS, ~30x slower "
        f"for matrix products; on Debian/Ubuntu run `{OPENBLAS_INSTALL_HINT}`"
    )


def _mlx_imported() -> bool:
    return "mlx.core" in sys.modules


def _set_threads(lib: ctypes.CDLL, threads: int) -> None:
    # The environment variable only counts when OpenBLAS initialises; this works afterwards too.
    set_num_threads = getattr(lib, "openblas_set_num_threads", None)
    if set_num_threads is not None:
        set_num_threads(ctypes.c_int(threads))


def setup_blas(threads: int | None = None) -> str | None:
    """Load OpenBLAS globally so that MLX's CPU backend uses it. Call before importing mlx.

    `threads` sets `OPENBLAS_NUM_THREADS` (before loading) and OpenBLAS's thread count (after):
    several MLX processes on one machine thrash with the default of one thread per core.

    Returns the library loaded (also on repeated calls), or None: on macOS (Accelerate is
    already used), when no OpenBLAS is installed (MLX still works, only slower), or when mlx
    was imported before the first call (too late to take effect).
    """
    global _loaded, _loaded_path
    if sys.platform != "linux":
        return None
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        os.environ[OPENBLAS_THREADS_ENV] = str(threads)
    if _loaded is not None:
        if threads is not None:
            _set_threads(_loaded, threads)
        return _loaded_path
    if _mlx_imported():
        logger.warning(
            "setup_blas() called after mlx was imported: MLX keeps its slow reference BLAS"
        )
        return None
    path = find_openblas()
    if path is None:
        logger.debug("no OpenBLAS found; MLX uses its bundled reference BLAS (slow)")
        return None
    try:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        logger.debug("could not load OpenBLAS from %s: %s", path, exc)
        return None
    if threads is not None:
        _set_threads(lib, threads)
    _loaded, _loaded_path = lib, path
    logger.debug("loaded OpenBLAS from %s", path)
    return path
