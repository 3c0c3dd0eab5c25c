"""Shared fixtures. BLAS is set up first: mlx must not be imported before it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, settings

from trexo.engine.blas import setup_blas

setup_blas()
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # tests start several MLX processes

REAP_TIMEOUT_S = 5.0

# Shared machines run identical work up to 3x slower: no per-example deadline, which would
# make property tests fail on timing rather than on behaviour.
settings.register_profile("trexo", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("trexo")


@pytest.fixture(autouse=True)
def no_leaked_processes() -> Iterator[None]:
    """Fail a test that leaves a child process behind, and kill what it left."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    leaked = [p for p in me.children(recursive=True) if p.pid not in before]
    for proc in leaked:
        proc.kill()
    psutil.wait_procs(leaked, timeout=REAP_TIMEOUT_S)
    alive = [p for p in leaked if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not leaked, f"test left processes behind: {leaked} (still alive after kill: {alive})"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The deterministic tiny demo model, built once per test session."""
    from trexo.engine.demo_model import ensure_demo_model

    return ensure_demo_model(tmp_path_factory.mktemp("models"), "tiny")
