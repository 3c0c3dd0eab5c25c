"""Shared fixtures. BLAS is set up first: mlx must not be imported before it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, settings

from tests.hub.fake_hub import FakeHub
from tests.tiers import StartsNoProcess
from tests.tiers import pytest_collection_modifyitems as pytest_collection_modifyitems
from trexo.engine.blas import setup_blas

setup_blas()
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # tests start several MLX processes

REAP_TIMEOUT_S = 5.0

# Shared machines run identical work up to 3x slower: no per-example deadline, which would
# make property tests fail on timing rather than on behaviour.
settings.register_profile("trexo", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("trexo")


PROCESS_WATCH = StartsNoProcess()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    PROCESS_WATCH.watch(item)


@pytest.fixture(autouse=True)
def fast_tests_start_no_process() -> Iterator[None]:
    """Fail a fast-tier test that starts a process (the rule is in tests/tiers.py)."""
    yield
    PROCESS_WATCH.verdict()


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


@pytest.fixture(scope="session")
def varied_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny demo model with strong blocks: its greedy output does not repeat itself."""
    from trexo.engine.demo_model import VARIED_DEMO_SIZE, ensure_demo_model

    return ensure_demo_model(tmp_path_factory.mktemp("models"), VARIED_DEMO_SIZE)


@pytest.fixture(scope="session")
def tools_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scripted demo model that calls a tool (`trexo.engine.scripted_model`)."""
    from trexo.engine.demo_model import TOOLS_DEMO_SIZE, ensure_demo_model

    return ensure_demo_model(tmp_path_factory.mktemp("models"), TOOLS_DEMO_SIZE)


@pytest.fixture(scope="session")
def thinking_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scripted demo model that reasons, then answers (`trexo.engine.thinking_model`)."""
    from trexo.engine.demo_model import THINKING_DEMO_SIZE, ensure_demo_model

    return ensure_demo_model(tmp_path_factory.mktemp("models"), THINKING_DEMO_SIZE)


UNTIED_HEAD_SEED = 7


@pytest.fixture(scope="session")
def untied_model(varied_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The varied model with a head of its own (`lm_head`), not tied to the embedding."""
    import json
    import shutil

    import mlx.core as mx

    path = tmp_path_factory.mktemp("models") / "trexo-test-untied"
    shutil.copytree(varied_model, path)
    config = json.loads((path / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (path / "config.json").write_text(json.dumps(config))
    weights = mx.load(str(path / "model.safetensors"))
    assert isinstance(weights, dict)
    embedding = weights["model.embed_tokens.weight"]
    noise = mx.random.normal(embedding.shape, key=mx.random.key(UNTIED_HEAD_SEED))
    weights["lm_head.weight"] = noise * embedding.std()
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["lm_head.weight"] = "model.safetensors"
    index_path.write_text(json.dumps(index))
    return path


@pytest.fixture(scope="session")
def repo_dirs(
    varied_model: Path, untied_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Hub repositories made from the demo models, with their weights in several files."""
    from tests.hub.repos import GATED, TIED, UNTIED, split_repo

    root = tmp_path_factory.mktemp("repos")
    return {
        TIED: split_repo(varied_model, root / "tied"),
        UNTIED: split_repo(untied_model, root / "untied"),
        GATED: split_repo(varied_model, root / "gated"),
    }


@pytest.fixture
def hub(repo_dirs: dict[str, Path]) -> Iterator[FakeHub]:
    """A fake Hugging Face hub on 127.0.0.1 serving `repo_dirs` (GATED behind a token)."""
    from tests.hub.fake_hub import serving
    from tests.hub.repos import GATED

    with serving() as served:
        for repo_id, directory in repo_dirs.items():
            served.add(repo_id, directory, gated=repo_id == GATED)
        yield served
