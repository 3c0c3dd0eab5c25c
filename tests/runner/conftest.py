"""Runner fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def varied_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny demo model with strong blocks: its greedy output does not repeat itself."""
    from trexo.engine.demo_model import VARIED_DEMO_SIZE, ensure_demo_model

    return ensure_demo_model(tmp_path_factory.mktemp("models"), VARIED_DEMO_SIZE)
