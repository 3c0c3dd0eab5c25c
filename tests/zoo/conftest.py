"""The zoo's fixture: every architecture built (once per session, on first use) into one
folder, shared by the in-process tests here and the real-process ones."""

from __future__ import annotations

import pytest

from .models import ZooModels


@pytest.fixture(scope="session")
def zoo_models(tmp_path_factory: pytest.TempPathFactory) -> ZooModels:
    return ZooModels(tmp_path_factory.mktemp("zoo"))
