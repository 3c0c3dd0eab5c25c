"""Where a model's weights are: the embedding, the blocks, the final norm and head.

Placement sizes each rank of a split by these shares (a pipeline's rank 0 holds the
embedding, its last rank the norm and head; a tensor split holds them on every rank). They
come from the weight files' own headers when a model is on disk (every tensor's name and
byte size: exact, whatever the architecture, quantized or not), else from `config.json`
(before a download) by the architecture's shapes: attention (latent attention's low-rank
projections too), dense or expert feed-forward parts (routed and shared experts, the first
dense blocks), and per-layer embeddings.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypedDict

from trexo import safe_json

SAFETENSORS_LENGTH_BYTES = 8
"""A safetensors file starts with its header's length, a little-endian u64."""
MAX_SAFETENSORS_HEADER_BYTES = 100 * 1024 * 1024
"""The safetensors library's own bound on a header."""
EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
SHARED_EXPERT_COUNT_FIELDS = ("n_shared_experts", "moe_num_shared_experts")
SHARED_WIDTH_FIELDS = ("shared_expert_intermediate_size", "shared_intermediate_size")
FIRST_DENSE_FIELDS = ("first_k_dense_replace", "moe_layer_start_index")
"""Blocks before the first mixture of experts (DeepSeek V3, GLM-4.5, ERNIE)."""


class WeightShares(TypedDict, total=False):
    """`ModelLayout`'s weight shares."""

    embedding_fraction: float
    head_fraction: float
    blocks_fraction: float
    embedding_on_every_rank: bool


def _count(config: Mapping[str, Any], *fields: str) -> int:
    for field in fields:
        value = config.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def shares_of(embedding: float, blocks: float, norm: float, head: float) -> WeightShares:
    """Shares from parameter counts (or bytes); `head` 0: tied to the embedding, which the
    last rank then holds again."""
    total = embedding + blocks + norm + head
    return {
        "embedding_fraction": embedding / total,
        "head_fraction": (norm + (head or embedding)) / total,
        "blocks_fraction": blocks / total,
    }


def config_shares(config: Mapping[str, Any]) -> WeightShares | None:
    """The shares a `config.json` (a vision-language model's `text_config`) implies; None if
    it lacks the sizes."""
    hidden, vocab = _count(config, "hidden_size"), _count(config, "vocab_size")
    n_layers, n_heads = _count(config, "num_hidden_layers"), _count(config, "num_attention_heads")
    if not (hidden and vocab and n_layers and n_heads):
        return None
    per_layer = _attention(config, hidden, n_heads) + 2 * hidden
    dense = 3 * hidden * _count(config, "intermediate_size")
    experts = _count(config, *EXPERT_COUNT_FIELDS)
    first_dense = min(_count(config, *FIRST_DENSE_FIELDS), n_layers) if experts else n_layers
    blocks = n_layers * per_layer + first_dense * dense
    if experts:
        width = _count(config, "moe_intermediate_size", "intermediate_size")
        shared = _count(config, *SHARED_WIDTH_FIELDS) or width * _count(
            config, *SHARED_EXPERT_COUNT_FIELDS
        )
        mixture = 3 * hidden * (width * experts + shared) + hidden * experts
        blocks += (n_layers - first_dense) * mixture
    embedding = vocab * hidden
    per_layer_inputs = _count(config, "hidden_size_per_layer_input")
    if per_layer_inputs:  # gemma 4: a per-layer embedding every rank needs
        per_layer_vocab = _count(config, "vocab_size_per_layer_input") or vocab
        embedding += per_layer_vocab * n_layers * per_layer_inputs
    tied = config.get("tie_word_embeddings", False) is True
    shares = shares_of(embedding, blocks, hidden, 0 if tied else vocab * hidden)
    if per_layer_inputs:
        shares["embedding_on_every_rank"] = True
    return shares


def _attention(config: Mapping[str, Any], hidden: int, n_heads: int) -> int:
    """One block's attention parameters."""
    kv_rank = _count(config, "kv_lora_rank")
    if kv_rank:  # latent attention
        rope, nope = _count(config, "qk_rope_head_dim"), _count(config, "qk_nope_head_dim")
        v_dim, q_rank = _count(config, "v_head_dim"), _count(config, "q_lora_rank")
        q_width = n_heads * (nope + rope)
        queries = hidden * q_rank + q_rank * q_width if q_rank else hidden * q_width
        latent = hidden * (kv_rank + rope) + kv_rank * n_heads * (nope + v_dim)
        return queries + latent + n_heads * v_dim * hidden
    head_dim = _count(config, "head_dim") or hidden // n_heads
    n_kv = _count(config, "num_key_value_heads") or n_heads
    return 2 * hidden * n_heads * head_dim + 2 * hidden * n_kv * head_dim


def tensor_shares(sizes: Iterable[tuple[str, int]]) -> WeightShares | None:
    """The shares of the weight files' tensors by name (`name`, bytes); None if they hold no
    blocks. The embedding is every `embed_tokens` (and whatever is outside the blocks and the
    head: a vision tower, rank 0's); the head is `lm_head` and the final norm."""
    embedding = blocks = norm = head = 0
    per_layer = False
    for name, size in sizes:
        if ".layers." in name and "vision" not in name:
            blocks += size
        elif "lm_head" in name:
            head += size
        elif name.endswith("norm.weight") or name.endswith("norm.bias"):
            norm += size
        else:
            embedding += size
            per_layer = per_layer or "embed_tokens_per_layer" in name
    if not blocks:
        return None
    shares = shares_of(embedding, blocks, norm, head)
    if per_layer:
        shares["embedding_on_every_rank"] = True
    return shares


def safetensors_sizes(model_dir: Path) -> list[tuple[str, int]] | None:
    """Every tensor's name and byte size, from the headers of the `.safetensors` files in
    `model_dir`; None if there are none or one cannot be read."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    sizes: list[tuple[str, int]] = []
    try:
        for path in files:
            sizes += _header_sizes(path)
    except (OSError, ValueError, struct.error, safe_json.InvalidJson):
        return None
    return sizes


def _header_sizes(path: Path) -> list[tuple[str, int]]:
    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(SAFETENSORS_LENGTH_BYTES))
        if length > MAX_SAFETENSORS_HEADER_BYTES:
            raise ValueError(f"{path.name}: a header of {length} bytes")
        header = safe_json.loads(file.read(length))
    if not isinstance(header, dict):
        raise ValueError(f"{path.name}: the header is not a JSON object")
    sizes = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2):
            raise ValueError(f"{path.name}: {json.dumps(name)} has no data offsets")
        start, end = offsets
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end):
            raise ValueError(f"{path.name}: {json.dumps(name)} has bad data offsets")
        sizes.append((name, end - start))
    return sizes
