"""Engine fixtures. BLAS first: OpenBLAS only helps if it is loaded before mlx is imported."""

from __future__ import annotations

from trexo.engine.blas import setup_blas

setup_blas()

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from trexo.engine.engine import Engine  # noqa: E402


@pytest.fixture(scope="session")
def engine(tiny_model: Path) -> Engine:
    """The tiny demo model, loaded and warmed up once per session. Do not mutate it."""
    loaded = Engine.load(tiny_model)
    loaded.warmup()
    return loaded
