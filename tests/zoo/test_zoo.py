"""The model zoo in one process: every architecture builds, loads with mlx-lm, answers with
varied greedy text, builds byte for byte the same, and trexo's engine batches it as mlx-lm
answers each request alone."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.nn as nn
import mlx_lm
import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model

from trexo import catalog
from trexo.cli import main
from trexo.engine.batch_limits import BATCH_LIMITS
from trexo.engine.engine import Engine
from trexo.engine.zoo import (
    QUANTIZATION_BITS,
    build_zoo_model,
    zoo_model_name,
)
from trexo.engine.zoo_archs import SLIDING_WINDOW, ZOO_ARCH_NAMES, ZOO_ARCHS

from .models import (
    BATCH_QUESTIONS,
    LONG_QUESTION,
    QUANTIZED_ARCHS,
    ZooModels,
    batched_greedy,
    chat_prompt,
    greedy,
)

MAX_TOKENS = 64
MIN_DISTINCT = 16
"""Distinct tokens in 64 greedy ones: far from a collapse to one repeated token (every zoo
model gives 22 or more; README, "The demo model")."""
BATCH_TOKENS = 16
MODULE_OF = {"mistral": "llama"}
"""mlx-lm's `MODEL_REMAPPING`: Mistral's `model_type` loads llama's module."""


@pytest.mark.parametrize("arch", ZOO_ARCH_NAMES)
def test_every_arch_loads_and_answers_with_varied_greedy_text(
    zoo_models: ZooModels, arch: str
) -> None:
    model, tokenizer = mlx_lm.load(str(zoo_models(arch)))
    assert len(chat_prompt(tokenizer, LONG_QUESTION)) > 2 * SLIDING_WINDOW
    answer = greedy(model, tokenizer, LONG_QUESTION, MAX_TOKENS)
    assert len(answer.tokens) == MAX_TOKENS
    assert len(set(answer.tokens)) >= MIN_DISTINCT, answer.tokens


@pytest.mark.parametrize("arch", ZOO_ARCH_NAMES)
def test_every_arch_is_mlx_lms_own_model_class(zoo_models: ZooModels, arch: str) -> None:
    path = zoo_models(arch)
    model, config = load_model(path)
    module = config["model_type"]
    assert type(model).__module__ == f"mlx_lm.models.{MODULE_OF.get(module, module)}"
    assert config["trexo_zoo"]["arch"] == arch
    layout = catalog.read_layout(path)  # what placement reads
    assert layout is not None
    blocks = (config.get("text_config") or config)["num_hidden_layers"]
    assert layout.n_layers == blocks >= 4  # enough for a pipeline over 3 ranks


@pytest.mark.parametrize("arch", ZOO_ARCH_NAMES)
def test_the_same_arch_and_seed_build_byte_identical_files(
    tmp_path: Path, zoo_models: ZooModels, arch: str
) -> None:
    again = build_zoo_model(tmp_path / "again", arch)
    assert file_bytes(again) == file_bytes(zoo_models(arch))
    other = build_zoo_model(tmp_path / "other", arch, seed=1)
    assert (other / "model.safetensors").read_bytes() != (again / "model.safetensors").read_bytes()


def file_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("arch", QUANTIZED_ARCHS)
def test_quantized_variants_load_and_answer_with_varied_greedy_text(
    tmp_path: Path, zoo_models: ZooModels, arch: str
) -> None:
    path = zoo_models(arch, quantized=True)
    assert path.name == f"trexo-zoo-{arch}-4bit"
    config = json.loads((path / "config.json").read_text())
    assert config["quantization"]["bits"] == QUANTIZATION_BITS
    model, tokenizer = mlx_lm.load(str(path))
    assert any(isinstance(m, nn.QuantizedLinear) for _, m in model.named_modules())
    answer = greedy(model, tokenizer, LONG_QUESTION, MAX_TOKENS)
    assert len(set(answer.tokens)) >= MIN_DISTINCT, answer.tokens
    assert file_bytes(build_zoo_model(tmp_path, arch, quantized=True)) == file_bytes(path)


@pytest.mark.parametrize("arch", ZOO_ARCH_NAMES)
def test_trexos_engine_batches_every_arch_as_mlx_lm_answers_alone(
    zoo_models: ZooModels, arch: str
) -> None:
    engine = Engine.load(zoo_models(arch), prefill_step=16)  # prompts span several chunks
    batch = engine.batch(max_batch=len(BATCH_QUESTIONS))
    together = batched_greedy(batch, lambda r: engine.admit(r)[1], BATCH_QUESTIONS, BATCH_TOKENS)
    for tokens, question in zip(together, BATCH_QUESTIONS, strict=True):
        alone = greedy(engine.model, engine.tokenizer, question, BATCH_TOKENS)
        assert tokens == alone.tokens, question


def test_names_say_the_arch_the_variant_and_a_nonzero_seed() -> None:
    assert zoo_model_name("qwen3") == "trexo-zoo-qwen3"
    assert zoo_model_name("qwen3", quantized=True) == "trexo-zoo-qwen3-4bit"
    assert zoo_model_name("qwen3", 7) == "trexo-zoo-qwen3-s7"
    with pytest.raises(ValueError, match="qwen3_moe"):
        zoo_model_name("qwen4")


def test_every_arch_says_what_it_brings() -> None:
    assert all(arch.about for arch in ZOO_ARCHS.values())
    assert {"llama", "mistral", "qwen3_moe", "gemma3_text", "deepseek_v3"} <= set(ZOO_ARCHS)


def test_the_cli_builds_a_zoo_model_into_the_models_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = str(tmp_path / "data")
    assert main(["demo-model", "--arch", "qwen3", "--quantized", "--data-dir", data_dir]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed == tmp_path / "data" / "models" / "trexo-zoo-qwen3-4bit"
    assert (printed / "config.json").is_file()


def test_the_cli_lists_the_zoo_and_refuses_what_is_not_in_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = str(tmp_path / "data")
    assert main(["demo-model", "--arch", "list", "--data-dir", data_dir]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == list(ZOO_ARCH_NAMES)
    assert main(["demo-model", "--arch", "qwen4", "--data-dir", data_dir]) == 2
    assert "--arch list" in capsys.readouterr().err
    assert main(["demo-model", "--quantized", "--data-dir", data_dir]) == 2
    assert "--arch" in capsys.readouterr().err
    assert not (tmp_path / "data" / "models").exists()


@pytest.mark.parametrize("arch", sorted(BATCH_LIMITS))
def test_each_batch_limit_still_guards_a_wrong_batch_in_mlx_lm(
    zoo_models: ZooModels, arch: str
) -> None:
    # Fails once mlx-lm batches the architecture right: then drop its limit.
    model, tokenizer = mlx_lm.load(str(zoo_models(arch)))
    questions = BATCH_QUESTIONS[:2]
    prompts = [chat_prompt(tokenizer, q) for q in questions]
    alone = [greedy(model, tokenizer, q, BATCH_TOKENS).tokens for q in questions]
    try:
        batched = mlx_lm.batch_generate(
            model, tokenizer, prompts, max_tokens=BATCH_TOKENS, return_token_ids=True
        )
    except ValueError:  # the broadcast error some batch sizes hit
        return
    assert [list(ids) for ids in batched.token_ids] != alone


EXPERT_AND_LATENT_ARCHS = ("mixtral", "qwen3_moe", "deepseek_v3", "glm4_moe", "minimax", "gpt_oss")


@pytest.mark.parametrize("arch", ZOO_ARCH_NAMES)
def test_placement_reads_the_weight_shares_of_the_files_themselves(
    zoo_models: ZooModels, arch: str
) -> None:
    path = zoo_models(arch)
    model, _ = load_model(path)
    blocks = sum(v.nbytes for name, v in tree_flatten(model.parameters()) if ".layers." in name)
    total = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    layout = catalog.read_layout(path)
    assert layout is not None
    assert layout.blocks_fraction == pytest.approx(blocks / total)
    assert layout.embedding_on_every_rank == (arch == "gemma4_text")


@pytest.mark.parametrize("arch", EXPERT_AND_LATENT_ARCHS)
def test_the_estimate_from_config_json_counts_experts_and_latent_attention(
    zoo_models: ZooModels, arch: str
) -> None:
    # What a hub model's placement has before its files are fetched.
    path = zoo_models(arch)
    exact = catalog.read_layout(path)
    estimate = catalog.layout_of(json.loads((path / "config.json").read_text()))
    assert exact is not None and estimate is not None
    assert estimate.blocks_fraction == pytest.approx(exact.blocks_fraction, abs=0.01)
    assert estimate.embedding_fraction == pytest.approx(exact.embedding_fraction, abs=0.01)
