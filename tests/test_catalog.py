"""The catalog's model refs carry the layout that decides how a model can be split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from trexo.catalog import builtin_models, demo_model_ref, layout_of, local_model_ref
from trexo.engine.demo_model import DEMO_MODEL_SPECS
from trexo.types.models import ModelLayout, TensorShape

LLAMA_CONFIG = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
}
LLAMA_TENSOR = TensorShape(32, 8, 0, (14336,))
"""What a tensor split of `LLAMA_CONFIG` divides (no hidden size: the head width unknown)."""


@pytest.mark.parametrize("size", list(DEMO_MODEL_SPECS))
def test_every_demo_model_has_its_specs_layout(size: str) -> None:
    spec = DEMO_MODEL_SPECS[size]
    # The embedding is tied to the head: the last rank holds it again, with the final norm.
    embedding = spec.vocab_size * spec.hidden_size / spec.parameter_count
    head = (spec.vocab_size + 1) * spec.hidden_size / spec.parameter_count
    assert demo_model_ref(size).layout == ModelLayout(
        spec.num_hidden_layers,
        spec.num_attention_heads,
        spec.num_key_value_heads,
        spec.intermediate_size,
        pytest.approx(embedding),  # type: ignore[arg-type]
        pytest.approx(head),  # type: ignore[arg-type]
        pytest.approx(1 - head),  # type: ignore[arg-type]
        tensor=TensorShape(
            spec.num_attention_heads,
            spec.num_key_value_heads,
            spec.hidden_size // spec.num_attention_heads,
            (spec.intermediate_size,),
        ),
    )
    assert all(model.layout is not None for model in builtin_models())


def write_model(path: Path, config: Any) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"\0" * 100)
    return path


def test_a_local_model_reads_its_layout_from_config_json(tmp_path: Path) -> None:
    model = local_model_ref(write_model(tmp_path / "llama", LLAMA_CONFIG))
    assert model.size_bytes == 100
    assert model.layout == ModelLayout(32, 32, 8, 14336, tensor=LLAMA_TENSOR)


@pytest.mark.parametrize(
    ("config", "layout"),
    [
        (LLAMA_CONFIG, ModelLayout(32, 32, 8, 14336, tensor=LLAMA_TENSOR)),
        # key-value heads default to the heads (multi-head attention)
        (
            {**LLAMA_CONFIG, "num_key_value_heads": None},
            ModelLayout(32, 32, 32, 14336, tensor=attrs.evolve(LLAMA_TENSOR, n_kv_heads=32)),
        ),
        (
            {k: v for k, v in LLAMA_CONFIG.items() if k != "num_key_value_heads"},
            ModelLayout(32, 32, 32, 14336, tensor=attrs.evolve(LLAMA_TENSOR, n_kv_heads=32)),
        ),
        # multimodal models nest the language model's config
        (
            {"text_config": LLAMA_CONFIG, "vision_config": {}},
            ModelLayout(32, 32, 8, 14336, tensor=LLAMA_TENSOR),
        ),
        ({k: v for k, v in LLAMA_CONFIG.items() if k != "intermediate_size"}, None),
        ({**LLAMA_CONFIG, "num_hidden_layers": "32"}, None),
        ({**LLAMA_CONFIG, "num_hidden_layers": 32.0}, None),
        ({**LLAMA_CONFIG, "num_attention_heads": True}, None),
        ({**LLAMA_CONFIG, "num_hidden_layers": 0}, None),
    ],
)
def test_layout_of_a_config(config: dict[str, Any], layout: ModelLayout | None) -> None:
    assert layout_of(config) == layout


@pytest.mark.parametrize("text", ["[1, 2]", "{not json", '"a string"'])
def test_an_unreadable_config_gives_no_layout(tmp_path: Path, text: str) -> None:
    path = write_model(tmp_path / "odd", {})
    (path / "config.json").write_text(text)
    assert local_model_ref(path).layout is None


def test_the_weights_outside_the_blocks_are_estimated_from_the_config() -> None:
    # Llama 3 8B: 128256 x 4096 embedding and head (untied), 32 blocks of ~218 M.
    config = {**LLAMA_CONFIG, "hidden_size": 4096, "vocab_size": 128256}
    layout = layout_of(config)
    assert layout is not None
    blocks = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096)
    embedding = 128256 * 4096
    total = 2 * embedding + 4096 + blocks  # ~8.0 G parameters
    assert layout.embedding_fraction == pytest.approx(embedding / total)
    assert layout.head_fraction == pytest.approx((embedding + 4096) / total)
    assert layout.blocks_fraction == pytest.approx(blocks / total)
    assert 0.06 < layout.embedding_fraction < 0.07  # ~0.53 G of ~8.0 G
    # Untied: each weight is counted once.
    parts = layout.embedding_fraction + layout.head_fraction + layout.blocks_fraction
    assert parts == pytest.approx(1.0)
    # Tied: the head is the embedding, which the last rank holds again.
    tied = layout_of({**config, "tie_word_embeddings": True})
    assert tied is not None and tied.embedding_fraction > layout.embedding_fraction
    assert tied.blocks_fraction + tied.head_fraction == pytest.approx(1.0)
