"""Which models a node can place, and where their files are."""

from __future__ import annotations

from pathlib import Path

from trexo.engine.demo_model import (
    DEFAULT_DEMO_SIZE,
    DEMO_MODEL_NAMES,
    DEMO_MODEL_SPECS,
    demo_model_name,
    ensure_demo_model,
)
from trexo.errors import ModelNotFound
from trexo.types.models import DEMO_SOURCE_PREFIX, ModelRef

FLOAT32_BYTES = 4
WEIGHT_SUFFIXES = (".safetensors", ".npz", ".gguf")
DEMO_MODELS_CREATED = 1_767_225_600
"""2026-01-01T00:00:00Z: the demo models' `created`; their bytes depend only on size and seed."""


def demo_model_ref(size: str = DEFAULT_DEMO_SIZE) -> ModelRef:
    """The built-in demo model of `size`; its size is computed, nothing is built."""
    spec = DEMO_MODEL_SPECS[size]
    return ModelRef(
        model_id=demo_model_name(size),
        source=f"{DEMO_SOURCE_PREFIX}{size}",
        size_bytes=spec.parameter_count * FLOAT32_BYTES,
        created=DEMO_MODELS_CREATED,
    )


def local_model_ref(path: Path) -> ModelRef:
    """A local mlx-lm model directory; its id is the directory's name."""
    path = path.expanduser().resolve()
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"{path} is not a model directory (no config.json)")
    size = sum(f.stat().st_size for f in path.iterdir() if f.suffix in WEIGHT_SUFFIXES)
    created = int((path / "config.json").stat().st_mtime)
    return ModelRef(model_id=path.name, source=str(path), size_bytes=size, created=created)


def builtin_models() -> list[ModelRef]:
    return [demo_model_ref(size) for size in DEMO_MODEL_NAMES]


def model_dir(model: ModelRef, models_dir: Path) -> Path:
    """The directory to load `model` from on this node; builds a demo model on first use."""
    if (size := model.demo_size) is not None:
        return ensure_demo_model(models_dir, size)
    path = Path(model.source)
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"model {model.model_id}: {path} is not on this node")
    return path
