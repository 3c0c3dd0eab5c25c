"""BLAS setup acts on process-wide state, so each case runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from trexo.engine.blas import find_openblas

needs_linux_openblas = pytest.mark.skipif(
    sys.platform != "linux" or find_openblas() is None, reason="needs Linux with OpenBLAS"
)


def run_python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout + done.stderr


@needs_linux_openblas
def test_loads_openblas_before_mlx_and_is_idempotent() -> None:
    out = run_python(
        """
        import os, sys
        from trexo.engine.blas import setup_blas
        path = setup_blas(threads=1)
        assert path is not None and "openblas" in path, path
        assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
        import mlx.core
        assert setup_blas() == path
        maps = open("/proc/self/maps").read()
        assert "openblas" in maps
        print("ok")
        """
    )
    assert "ok" in out


@needs_linux_openblas
def test_after_mlx_import_warns_and_does_nothing() -> None:
    out = run_python(
        """
        import logging
        logging.basicConfig(level=logging.DEBUG)
        import mlx.core
        from trexo.engine.blas import setup_blas
        assert setup_blas() is None
        print("ok")
        """
    )
    assert "ok" in out
    assert "after mlx was imported" in out


def test_importing_trexo_engine_blas_does_not_import_mlx() -> None:
    out = run_python(
        """
        import sys
        import trexo.engine.blas, trexo.engine.stops, trexo.engine.demo_model
        print("mlx" in sys.modules)
        """
    )
    assert out.strip().endswith("False")


def test_a_missing_openblas_is_a_warning_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ctypes.util

    from trexo.engine import blas

    monkeypatch.setattr(blas, "OPENBLAS_CANDIDATE_DIRS", ())
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    warning = blas.missing_openblas_warning()
    if sys.platform == "linux":
        assert warning is not None
        assert "apt-get install libopenblas0-pthread" in warning
    else:
        assert warning is None


@needs_linux_openblas
def test_no_warning_when_openblas_is_there() -> None:
    from trexo.engine.blas import missing_openblas_warning

    assert missing_openblas_warning() is None
