"""Which models a node can place, and where their files are."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeGuard

import attrs

from trexo.engine.demo_model import (
    DEFAULT_DEMO_SIZE,
    DEMO_MODEL_NAMES,
    DEMO_MODEL_SPECS,
    demo_model_name,
    ensure_demo_model,
)
from trexo.engine.pipeline_cuts import limited_cuts
from trexo.engine.tensor_shares import shape_of as tensor_shape_of
from trexo.errors import ModelNotFound
from trexo.json_file import read_json_object
from trexo.types.models import DEMO_SOURCE_PREFIX, ModelLayout, ModelRef, TensorShape
from trexo.weight_shares import config_shares, safetensors_sizes, tensor_shares

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
        layout=ModelLayout(
            n_layers=spec.num_hidden_layers,
            n_heads=spec.num_attention_heads,
            n_kv_heads=spec.num_key_value_heads,
            intermediate_size=spec.intermediate_size,
            tensor=TensorShape(
                spec.num_attention_heads,
                spec.num_key_value_heads,
                spec.hidden_size // spec.num_attention_heads,
                (spec.intermediate_size,),
            ),
            **(
                config_shares(
                    {
                        "hidden_size": spec.hidden_size,
                        "vocab_size": spec.vocab_size,
                        "num_hidden_layers": spec.num_hidden_layers,
                        "num_attention_heads": spec.num_attention_heads,
                        "num_key_value_heads": spec.num_key_value_heads,
                        "intermediate_size": spec.intermediate_size,
                        "tie_word_embeddings": True,
                    }
                )
                or {}
            ),
        ),
    )


def local_model_ref(path: Path) -> ModelRef:
    """A local mlx-lm model directory; its id is the directory's name."""
    path = path.expanduser().resolve()
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"{path} is not a model directory (no config.json)")
    size = sum(f.stat().st_size for f in path.iterdir() if f.suffix in WEIGHT_SUFFIXES)
    created = int((path / "config.json").stat().st_mtime)
    return ModelRef(
        model_id=path.name,
        source=str(path),
        size_bytes=size,
        created=created,
        layout=read_layout(path),
    )


def read_layout(path: Path) -> ModelLayout | None:
    """The layout of the mlx-lm model directory `path`, from its `config.json`, with the
    weight shares its weight files' headers give; None if the config is unreadable or lacks
    a field."""
    try:
        layout = layout_of(read_json_object(path / "config.json"))
    except (OSError, ValueError):  # `BadJsonFile` is a ValueError
        return None
    sizes = safetensors_sizes(path)
    exact = tensor_shares(sizes) if sizes is not None else None
    return attrs.evolve(layout, **exact) if layout is not None and exact else layout


def layout_of(config: Mapping[str, Any]) -> ModelLayout | None:
    """The layout in a parsed `config.json` (or its `text_config`, as multimodal models nest
    it); `num_key_value_heads` absent or null is the head count, as in mlx-lm."""
    whole_config, text_config = config, config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(text_config, dict):
        config = text_config
    heads = config.get("num_attention_heads")
    fields = (
        config.get("num_hidden_layers"),
        heads,
        heads if config.get("num_key_value_heads") is None else config["num_key_value_heads"],
        config.get("intermediate_size"),
    )
    counts = [value for value in fields if _is_count(value)]
    if len(counts) != len(fields):
        return None
    n_layers, n_heads, n_kv_heads, intermediate_size = counts
    shares = config_shares(config) or {}
    cuts, because = limited_cuts(config) or (None, "")
    return ModelLayout(
        n_layers,
        n_heads,
        n_kv_heads,
        intermediate_size,
        **shares,
        pipeline_cuts=cuts,
        cuts_limited_because=because,
        tensor=tensor_shape_of(whole_config),
    )


def _is_count(value: object) -> TypeGuard[int]:
    """A positive JSON integer (`true` is not 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


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
