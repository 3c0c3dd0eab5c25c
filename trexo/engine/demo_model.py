"""Deterministic demo models: built offline in well under a second, loadable by `mlx_lm.load`.

A demo model is a llama (`mlx_lm.models.llama`) with seeded random float32 weights and a
byte-level BPE tokenizer trained on the standard library's `pydoc_data.topics` text, with a
ChatML chat template. Its output is nonsense; what matters is that the same size and seed give
byte-identical files, so greedy output is the same wherever it is built (with the same Python:
the training text is the stdlib's, and `corpus_sha256` in `config.json` records which).
Sizes "tools" and "thinking" are the exceptions that mean something: their weights are
constructed so that greedy output follows a script, a tool call (`trexo.engine.scripted_model`)
or a thinking model's reasoning and answer (`trexo.engine.thinking_model`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from tokenizers import Tokenizer

DEMO_MODEL_PREFIX = "trexo-demo-"
DEFAULT_DEMO_SIZE = "tiny"
DEFAULT_DEMO_SEED = 0

DEMO_VOCAB_SIZE = 2048
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (IM_START, IM_END)
"""Trained first, so they get ids 0 and 1 in every build."""

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

VARIED_DEMO_SIZE = "tiny-varied"
VARIED_BLOCK_SCALE = 3.0
BLOCK_PARAMETER_PREFIX = "model.layers."
"""Names of the transformer blocks' parameters (what `block_scale` multiplies)."""

TOOLS_DEMO_SIZE = "tools"
"""The scripted model (`trexo.engine.scripted_model`): constructed weights whose greedy
output follows a tool-calling script."""
SCRIPTED_ADDED_TOKENS = 14
"""Tokens the scripted model adds to the BPE's vocabulary (its builder checks the count)."""
THINKING_DEMO_SIZE = "thinking"
"""The scripted thinking model (`trexo.engine.thinking_model`): it reasons, then answers."""
THINKING_ADDED_TOKENS = 9

MAX_POSITION_EMBEDDINGS = 4096
RMS_NORM_EPS = 1e-5
ROPE_THETA = 10000.0


@attrs.frozen
class DemoModelSpec:
    """Shape of one demo size. Every size is a float32 llama with tied embeddings."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int = DEMO_VOCAB_SIZE
    block_scale: float = 1.0
    """Factor on the transformer blocks' weight matrices. At 1.0 the residual stream is
    dominated by the token embedding and greedy output soon repeats one token; at 3.0 the
    next token depends on the whole context, which tests of split models need (a test that
    compares a repeated token proves little)."""

    @property
    def parameter_count(self) -> int:
        head_dim = self.hidden_size // self.num_attention_heads
        attention = 2 * self.hidden_size * self.num_attention_heads * head_dim
        attention += 2 * self.hidden_size * self.num_key_value_heads * head_dim
        mlp = 3 * self.hidden_size * self.intermediate_size
        per_layer = attention + mlp + 2 * self.hidden_size  # + two RMS norms
        embedding_and_final_norm = (self.vocab_size + 1) * self.hidden_size
        return embedding_and_final_norm + self.num_hidden_layers * per_layer


DEMO_MODEL_SPECS: Mapping[str, DemoModelSpec] = MappingProxyType(
    {
        # ~0.85 M parameters, 3.4 MB: for tests.
        "tiny": DemoModelSpec(128, 4, 4, 2, 256),
        # tiny's shape with stronger blocks: varied greedy output, for split-model tests.
        VARIED_DEMO_SIZE: DemoModelSpec(128, 4, 4, 2, 256, block_scale=VARIED_BLOCK_SCALE),
        # ~20 M parameters, 80 MB: for benchmarks.
        "small": DemoModelSpec(512, 8, 8, 4, 1024),
        # ~72 k parameters, 0.3 MB, one layer and one head: the script's lookup, for tests.
        TOOLS_DEMO_SIZE: DemoModelSpec(
            32, 1, 1, 1, 16, vocab_size=DEMO_VOCAB_SIZE + SCRIPTED_ADDED_TOKENS
        ),
        # tools' shape, with the thinking script's tokens.
        THINKING_DEMO_SIZE: DemoModelSpec(
            32, 1, 1, 1, 16, vocab_size=DEMO_VOCAB_SIZE + THINKING_ADDED_TOKENS
        ),
    }
)
DEMO_MODEL_NAMES: tuple[str, ...] = tuple(DEMO_MODEL_SPECS)


def demo_model_name(size: str = DEFAULT_DEMO_SIZE, seed: int = DEFAULT_DEMO_SEED) -> str:
    """Directory name of a demo model: `trexo-demo-tiny`, or `trexo-demo-tiny-s7` for seed 7."""
    _spec(size)
    return f"{DEMO_MODEL_PREFIX}{size}" + (f"-s{seed}" if seed else "")


def _spec(size: str) -> DemoModelSpec:
    try:
        return DEMO_MODEL_SPECS[size]
    except KeyError:
        raise ValueError(
            f"unknown demo model size {size!r}; known: {', '.join(DEMO_MODEL_NAMES)}"
        ) from None


# --- tokenizer -----------------------------------------------------------------------------


def _training_corpus() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)]


def _corpus_digest(corpus: list[str]) -> str:
    digest = hashlib.sha256()
    for text in corpus:
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def _train_tokenizer(
    corpus: list[str], vocab_size: int, added_tokens: Sequence[str] = ()
) -> Tokenizer:
    """The trained BPE, then `added_tokens` (non-special, matched verbatim) after its vocab."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The trainer's merge choice is deterministic (ties broken by pair order), whatever the
    # thread count; the builds-are-identical test holds us to that.
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.add_tokens([AddedToken(token, normalized=False) for token in added_tokens])
    return tokenizer


def _token_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise RuntimeError(f"the trained tokenizer lacks token {token!r}")
    return token_id


def _write_tokenizer(dest: Path, tokenizer: Tokenizer, chat_template: str) -> dict[str, int]:
    """Write the tokenizer files; return the special tokens' ids."""
    (dest / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n")
    ids = {token: _token_id(tokenizer, token) for token in SPECIAL_TOKENS}
    # Written by hand rather than by `PreTrainedTokenizerFast.save_pretrained`, whose output
    # differs between transformers 4 and 5 (5 names a class that 4 does not have).
    _write_json(
        dest / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": IM_END,
            "pad_token": IM_END,
            "unk_token": None,
            "additional_special_tokens": [IM_START],
            "added_tokens_decoder": {
                str(token_id): {
                    "content": token.content,
                    "lstrip": False,
                    "normalized": False,
                    "rstrip": False,
                    "single_word": False,
                    "special": token.special,
                }
                for token_id, token in tokenizer.get_added_tokens_decoder().items()
            },
            "chat_template": chat_template,
            "clean_up_tokenization_spaces": False,
            "model_max_length": MAX_POSITION_EMBEDDINGS,
        },
    )
    _write_json(
        dest / "special_tokens_map.json",
        {"eos_token": IM_END, "pad_token": IM_END, "additional_special_tokens": [IM_START]},
    )
    return ids


def _build_tokenizer(dest: Path, corpus: list[str], vocab_size: int) -> dict[str, int]:
    """Train the BPE, write the tokenizer files; return the special tokens' ids."""
    return _write_tokenizer(dest, _train_tokenizer(corpus, vocab_size), CHATML_TEMPLATE)


# --- model ---------------------------------------------------------------------------------


def _model_config(
    spec: DemoModelSpec, size: str, seed: int, eos_id: int, corpus_sha256: str
) -> dict[str, Any]:
    demo: dict[str, Any] = {"size": size, "seed": seed, "corpus_sha256": corpus_sha256}
    if spec.block_scale != 1.0:  # only then: the other sizes' files stay byte-identical
        demo["block_scale"] = spec.block_scale
    return {
        "model_type": "llama",  # selects mlx_lm.models.llama
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "trexo_demo": demo,
    }


def _build_weights(dest: Path, config: dict[str, Any], seed: int, block_scale: float = 1.0) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.models import llama
    from mlx_lm.utils import save_config, save_model

    model = llama.Model(llama.ModelArgs.from_dict(config))  # type: ignore[no-untyped-call]
    # Explicit keys, one per parameter in name order: the weights depend on the seed only,
    # not on MLX's global random state or on the order modules initialise in.
    params: list[tuple[str, mx.array]] = sorted(
        tree_flatten(model.parameters()),  # type: ignore[arg-type]
        key=lambda item: item[0],
    )
    keys = mx.random.split(mx.random.key(seed), len(params))
    weights = []
    for key, (name, param) in zip(keys, params, strict=True):
        if param.ndim == 1:  # RMS norm scales
            value = mx.ones(param.shape, dtype=mx.float32)
        else:  # N(0, 1/fan_in) keeps activations and tied-embedding logits near unit scale
            value = mx.random.normal(param.shape, dtype=mx.float32, key=key)
            value = value * (param.shape[-1] ** -0.5)
            if block_scale != 1.0 and name.startswith(BLOCK_PARAMETER_PREFIX):
                value = value * block_scale
        weights.append((name, value))
    model.update(tree_unflatten(weights))
    mx.eval(model.parameters())
    save_model(dest, model)
    save_config(config, dest / "config.json")


def build_demo_model(
    dest: Path, size: str = DEFAULT_DEMO_SIZE, seed: int = DEFAULT_DEMO_SEED
) -> Path:
    """Build demo model `size` with weights from `seed` (but for the scripted sizes)
    into directory `dest`; return `dest`.

    Needs no network. The same size and seed give byte-identical files. Writes in place: use
    `ensure_demo_model` for a cached, atomically published model.
    """
    spec = _spec(size)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if size == TOOLS_DEMO_SIZE:
        # Imported here: the scripted model's module builds on this one.
        from trexo.engine.scripted_model import build_scripted_model

        return build_scripted_model(dest, spec, seed)
    if size == THINKING_DEMO_SIZE:
        from trexo.engine.scripted_model import build_scripted_model
        from trexo.engine.thinking_model import THINKING_SCRIPT

        return build_scripted_model(dest, spec, seed, THINKING_SCRIPT)
    corpus = _training_corpus()
    ids = _build_tokenizer(dest, corpus, spec.vocab_size)
    config = _model_config(spec, size, seed, ids[IM_END], _corpus_digest(corpus))
    _build_weights(dest, config, seed, spec.block_scale)
    return dest


def ensure_demo_model(
    models_dir: Path, size: str = DEFAULT_DEMO_SIZE, seed: int = DEFAULT_DEMO_SEED
) -> Path:
    """The demo model's directory under `models_dir`, built on first use (`publish_built`)."""
    final = Path(models_dir) / demo_model_name(size, seed)
    return publish_built(final, lambda tmp: build_demo_model(tmp, size, seed))


def publish_built(final: Path, build: Callable[[Path], object]) -> Path:
    """`final`, built by `build(directory)` unless it is there already.

    The model is built into a hidden temporary directory beside its final place and renamed
    into place, so neither a concurrent caller nor a crash ever leaves a half-written model
    under the final name. If a concurrent caller publishes first, its (identical) copy wins.
    """
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it owner-only
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
