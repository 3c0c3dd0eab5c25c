"""The model zoo: a tiny deterministic random-weight model of each mlx-lm architecture.

The demo models are llamas; the models people split across machines are not. A zoo model is
built from mlx-lm's own model class and config dataclass for its architecture
(`trexo.engine.zoo_archs`), with the demo model's tokenizer and ChatML template, seeded
random float32 weights, and optionally mlx-lm's own 4-bit quantization. It is built offline
in a fifth of a second, loads with `mlx_lm.load`, and the same architecture, seed and variant
give byte-identical files. Its text is nonsense, but varied: the blocks' weights are scaled
so that greedy output does not collapse to one repeated token, so a split model that differs
from the whole one shows it.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trexo.engine.demo_model import (
    CHATML_TEMPLATE,
    DEMO_VOCAB_SIZE,
    IM_END,
    _corpus_digest,
    _train_tokenizer,
    _training_corpus,
    _write_tokenizer,
    publish_built,
)
from trexo.engine.zoo_archs import COMMON, ZOO_ARCH_NAMES, ZOO_ARCHS, ZooArch

if TYPE_CHECKING:
    from tokenizers import Tokenizer

ZOO_MODEL_PREFIX = "trexo-zoo-"
QUANTIZED_SUFFIX = "-4bit"
DEFAULT_ZOO_SEED = 0
QUANTIZATION_BITS = 4
QUANTIZATION_GROUP_SIZE = 64
"""mlx-lm's default for 4 bits (`mlx_lm.convert -q`): what mlx-community's 4-bit models use.
A layer whose input width is not a multiple of it stays float, as `quantize_model` leaves it."""
PER_HEAD_VECTORS = ("sinks",)
"""Vectors with a value per attention head, drawn N(0, 1): the class starts them all equal,
which would hide a split that gives a rank another rank's heads."""
EMBEDDING_NAMES = ("embed_tokens", "lm_head")
"""The edges: their matrices are not scaled with the blocks'."""


def zoo_model_name(arch: str, seed: int = DEFAULT_ZOO_SEED, *, quantized: bool = False) -> str:
    """Directory name of a zoo model: `trexo-zoo-qwen3`, `trexo-zoo-qwen3-4bit`, or with a
    nonzero seed `trexo-zoo-qwen3-s7`."""
    zoo_arch(arch)
    return (
        f"{ZOO_MODEL_PREFIX}{arch}"
        + (QUANTIZED_SUFFIX if quantized else "")
        + (f"-s{seed}" if seed else "")
    )


def zoo_arch(name: str) -> ZooArch:
    try:
        return ZOO_ARCHS[name]
    except KeyError:
        raise ValueError(
            f"unknown zoo architecture {name!r}; known: {', '.join(ZOO_ARCH_NAMES)}"
        ) from None


def zoo_config(arch: ZooArch, eos_id: int, seed: int, corpus_sha256: str) -> dict[str, Any]:
    """The model's `config.json` (before quantization adds its entry)."""
    # A pad token in the vocabulary: transformers' config classes default to one beyond it.
    tokens = {"bos_token_id": None, "eos_token_id": eos_id, "pad_token_id": eos_id}
    text = {**COMMON, **arch.config, "vocab_size": DEMO_VOCAB_SIZE, **tokens}
    zoo = {"arch": arch.name, "seed": seed, "corpus_sha256": corpus_sha256}
    outer = {**tokens, "torch_dtype": "float32", "trexo_zoo": zoo}
    if arch.wrapper is None:
        return {**text, **outer}
    # mlx-lm reads the vocabulary's size and the head's tying from the wrapper too.
    tied = text["tie_word_embeddings"]
    return {
        **arch.wrapper,
        "vocab_size": DEMO_VOCAB_SIZE,
        "tie_word_embeddings": tied,
        "text_config": text,
        **outer,
    }


def build_zoo_model(
    dest: Path, arch: str, seed: int = DEFAULT_ZOO_SEED, *, quantized: bool = False
) -> Path:
    """Build the zoo model of architecture `arch` into directory `dest`; return `dest`.

    Needs no network. The same architecture, seed and variant give byte-identical files.
    Writes in place: use `ensure_zoo_model` for a cached, atomically published model.
    """
    spec = zoo_arch(arch)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer, corpus_sha256 = _demo_tokenizer()
    eos_id = _write_tokenizer(dest, tokenizer, CHATML_TEMPLATE)[IM_END]
    config = zoo_config(spec, eos_id, seed, corpus_sha256)
    _build_weights(dest, config, seed, spec, quantized=quantized)
    return dest


def ensure_zoo_model(
    models_dir: Path, arch: str, seed: int = DEFAULT_ZOO_SEED, *, quantized: bool = False
) -> Path:
    """The zoo model's directory under `models_dir`, built on first use (atomically, as
    `ensure_demo_model` publishes a demo model)."""
    final = Path(models_dir) / zoo_model_name(arch, seed, quantized=quantized)
    return publish_built(final, lambda tmp: build_zoo_model(tmp, arch, seed, quantized=quantized))


@functools.cache
def _demo_tokenizer() -> tuple[Tokenizer, str]:
    """The demo model's tokenizer and its corpus's digest, trained once per process (a
    sixth of a second each time; the zoo's tests build dozens of models)."""
    corpus = _training_corpus()
    return _train_tokenizer(corpus, DEMO_VOCAB_SIZE), _corpus_digest(corpus)


def _build_weights(
    dest: Path, config: dict[str, Any], seed: int, arch: ZooArch, *, quantized: bool
) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

    # mlx-lm's own lookup, its renames included (model_type "mistral" is llama's module).
    model_class, args_class = _get_classes(config)
    # The class's own initial values of vectors (norm scales, biases, state-space decay
    # rates, attention sinks) are what the architecture starts from; seeding MLX's global
    # generator first makes the random ones among them depend on the seed only.
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    # Matrices: explicit keys, one per parameter in name order, as the demo model draws them.
    params: list[tuple[str, mx.array]] = sorted(
        tree_flatten(model.parameters()),  # type: ignore[arg-type]
        key=lambda item: item[0],
    )
    keys = mx.random.split(mx.random.key(seed), len(params))
    weights = [
        (name, _initial_value(name, param, key, arch))
        for key, (name, param) in zip(keys, params, strict=True)
    ]
    model.update(tree_unflatten(weights))
    mx.eval(model.parameters())
    if quantized:
        # `quantize_model` reports the bits per weight on stdout, which carries the path.
        with contextlib.redirect_stdout(sys.stderr):
            model, config = quantize_model(
                model, config, QUANTIZATION_GROUP_SIZE, QUANTIZATION_BITS
            )
    save_model(dest, model)
    save_config(config, dest / "config.json")


def _initial_value(name: str, param: Any, key: Any, arch: ZooArch) -> Any:
    """N(0, 1/fan_in) for a matrix (times `block_scale` in the blocks), which keeps
    activations and logits near unit scale; a vector as the class made it (a post-norm's
    scale times `block_scale`), but N(0, 1) for a per-head one."""
    import mlx.core as mx

    if name.rsplit(".", 1)[-1] in PER_HEAD_VECTORS:
        return mx.random.normal(param.shape, dtype=mx.float32, key=key)
    if param.ndim < 2:
        module = name.split(".")[-2:-1]  # "model.layers.0.q_norm.weight": ["q_norm"]
        return param * arch.block_scale if module and module[0] in arch.post_norms else param
    # A convolution's weight is (out, kernel, in / groups): its fan-in is all but the first.
    fan_in = math.prod(param.shape[1:]) if "conv" in name else param.shape[-1]
    value = mx.random.normal(param.shape, dtype=mx.float32, key=key) * (fan_in**-0.5)
    if not any(edge in name for edge in EMBEDDING_NAMES):
        value = value * arch.block_scale
    return value
