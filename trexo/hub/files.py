"""Which files of a model repository a node needs. Pure functions: no I/O.

A node fetches a repository's small files (config, tokenizer, chat template, the weight
index) always, and of its weights only the files that hold a tensor of its part: a whole
model needs every weight file; rank r of a pipeline needs the files holding its blocks'
tensors, plus the embedding on rank 0 and the final norm and head on the last rank (a head
tied to the embedding is the embedding again), exactly what `trexo.engine.sharding` keeps;
a tensor-parallel rank holds a slice of every weight, so it needs them all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from trexo.types.shard import ShardSpec

WEIGHT_SUFFIX = ".safetensors"
WEIGHT_INDEX = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SMALL_FILE_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".tiktoken")
"""Config, tokenizer (`tokenizer.json`, `merges.txt`, sentencepiece `.model`, tiktoken),
chat templates. Everything else (README, images, PyTorch or GGUF weights) is not fetched."""
BLOCK_TENSOR = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")
EMBEDDING_MARK = "embed_tokens"
HEAD_MARK = "lm_head"
FINAL_NORM = re.compile(r"(?:^|\.)norm\.(?:weight|bias)$")
"""The final norm beside the blocks (`model.norm.weight`), which `sharding` drops off all but
the last rank."""


@attrs.frozen
class RepoFile:
    """One file of a repository at a commit, as the hub lists it."""

    name: str
    size: int
    sha256: str | None = None
    """Of a large (LFS) file: its content hash, which is also its cache name."""
    blob_id: str | None = None
    """Of a small (git) file: its git blob id, which is also its cache name."""

    @property
    def etag(self) -> str | None:
        """The name the Hugging Face cache stores its content under."""
        return self.sha256 or self.blob_id


def is_weight_file(name: str) -> bool:
    return name.endswith(WEIGHT_SUFFIX) and "/" not in name


def is_small_file(name: str) -> bool:
    """A file every node of the model fetches (config, tokenizer, templates, the index)."""
    return "/" not in name and name.endswith(SMALL_FILE_SUFFIXES)


def weight_map(index: Mapping[str, Any]) -> dict[str, str]:
    """Tensor name -> file, from a parsed `model.safetensors.index.json`; `ValueError` if it
    has no usable map."""
    found = index.get("weight_map")
    if not isinstance(found, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in found.items()
    ):
        raise ValueError(f"{WEIGHT_INDEX} has no weight_map of tensor names to files")
    return found


def tensor_needed(name: str, shard: ShardSpec, *, tied: bool, split_edges: bool = True) -> bool:
    """Whether the runner holding `shard` needs tensor `name` (see the module's rules).

    `split_edges`: the model keeps its edges where `trexo.engine.sharding` finds them (an
    `embed_tokens` embedding): rank 0 holds the embedding, the last rank the final norm and
    the head. Otherwise every rank holds every tensor outside the blocks.
    """
    if shard.is_whole or shard.sharding == "tensor":
        return True
    start, end = shard.start_layer, shard.end_layer
    if start is None or end is None:
        return True
    block = BLOCK_TENSOR.search(name)
    if block is not None:
        return start <= int(block.group(1)) < end
    if not split_edges:
        return True
    is_first, is_last = shard.rank == 0, shard.rank == shard.world_size - 1
    if EMBEDDING_MARK in name:
        return is_first or (is_last and tied)
    if HEAD_MARK in name or FINAL_NORM.search(name):
        return is_last
    return True  # anything else outside the blocks: small, and safest everywhere


def _needed_files(mapping: Mapping[str, str], shard: ShardSpec) -> set[str]:
    tied = not any(HEAD_MARK in tensor for tensor in mapping)
    split_edges = any(EMBEDDING_MARK in tensor for tensor in mapping)
    return {
        file
        for tensor, file in mapping.items()
        if tensor_needed(tensor, shard, tied=tied, split_edges=split_edges)
    }


def files_for_shard(
    files: Iterable[RepoFile], index: Mapping[str, Any] | None, shard: ShardSpec
) -> list[RepoFile]:
    """The files the runner holding `shard` needs, in the listing's order.

    Without an index (one weight file), every weight file is needed. The head is tied to
    the embedding when the index names no `lm_head` tensor.
    """
    listed = list(files)
    weights = {f.name for f in listed if is_weight_file(f.name)}
    if index is not None:
        weights &= _needed_files(weight_map(index), shard)
    return [f for f in listed if is_small_file(f.name) or f.name in weights]


def missing_weight_files(
    index: Mapping[str, Any] | None, shard: ShardSpec, present: Iterable[str]
) -> list[str]:
    """Weight files the runner holding `shard` needs that are not among `present` (names),
    by the index; without one, only whether any weight file is present at all."""
    have = set(present)
    if index is None:
        return [] if any(is_weight_file(name) for name in have) else [f"*{WEIGHT_SUFFIX}"]
    return sorted(_needed_files(weight_map(index), shard) - have)
