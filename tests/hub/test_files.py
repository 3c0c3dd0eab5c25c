"""Which files a node fetches: pure rules, checked against a layout like a real sharded repo."""

from __future__ import annotations

import pytest

from trexo.hub.files import (
    RepoFile,
    files_for_shard,
    is_small_file,
    missing_weight_files,
    tensor_needed,
    weight_map,
)
from trexo.types.shard import ShardSpec

FILES = [
    RepoFile("README.md", 10),
    RepoFile(".gitattributes", 10),
    RepoFile("config.json", 10),
    RepoFile("tokenizer.json", 10),
    RepoFile("tokenizer_config.json", 10),
    RepoFile("chat_template.jinja", 10),
    RepoFile("model.safetensors.index.json", 10),
    RepoFile("model-00001-of-00004.safetensors", 100),
    RepoFile("model-00002-of-00004.safetensors", 100),
    RepoFile("model-00003-of-00004.safetensors", 100),
    RepoFile("model-00004-of-00004.safetensors", 100),
    RepoFile("pytorch_model.bin", 400),
    RepoFile("images/diagram.png", 10),
]
SMALL = {
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "model.safetensors.index.json",
}


def index(*, tied: bool) -> dict[str, object]:
    """8 layers: the embedding with layers 0-1 in file 1, 2-3 in 2, 4-5 in 3, 6-7 and the
    final norm (and the head) in 4."""
    mapping = {"model.embed_tokens.weight": "model-00001-of-00004.safetensors"}
    for layer in range(8):
        file = f"model-0000{layer // 2 + 1}-of-00004.safetensors"
        for part in ("self_attn.q_proj.weight", "mlp.down_proj.scales"):
            mapping[f"model.layers.{layer}.{part}"] = file
    mapping["model.norm.weight"] = "model-00004-of-00004.safetensors"
    if not tied:
        mapping["lm_head.weight"] = "model-00004-of-00004.safetensors"
    return {"metadata": {"total_size": 400}, "weight_map": mapping}


def names(files: list[RepoFile]) -> set[str]:
    return {f.name for f in files} - SMALL


def test_small_files_are_config_tokenizer_and_templates_only() -> None:
    assert {f.name for f in FILES if is_small_file(f.name)} == SMALL


@pytest.mark.parametrize("shard", [ShardSpec(), ShardSpec(0, 8, 1, 2, "tensor")])
def test_a_whole_model_or_a_tensor_rank_needs_every_weight_file(shard: ShardSpec) -> None:
    wanted = files_for_shard(FILES, index(tied=True), shard)
    assert {f.name for f in wanted} >= SMALL
    assert len(names(wanted)) == 4
    assert "pytorch_model.bin" not in names(wanted)


@pytest.mark.parametrize(
    ("shard", "tied", "files"),
    [
        # rank 0: the embedding's file and its layers'
        (ShardSpec(0, 2, 0, 3), False, {1}),
        (ShardSpec(0, 3, 0, 3), False, {1, 2}),
        # a middle rank: its layers only, no embedding, no head
        (ShardSpec(3, 5, 1, 3), False, {2, 3}),
        (ShardSpec(3, 5, 1, 3), True, {2, 3}),
        # the last rank: its layers, the norm and the head; a tied head is the embedding
        (ShardSpec(6, 8, 2, 3), False, {4}),
        (ShardSpec(6, 8, 2, 3), True, {1, 4}),
    ],
)
def test_a_pipeline_rank_needs_the_files_of_its_part(
    shard: ShardSpec, tied: bool, files: set[int]
) -> None:
    wanted = files_for_shard(FILES, index(tied=tied), shard)
    assert names(wanted) == {f"model-0000{i}-of-00004.safetensors" for i in files}
    assert {f.name for f in wanted} >= SMALL


def test_without_an_index_every_rank_needs_the_one_weight_file() -> None:
    files = [RepoFile("config.json", 1), RepoFile("model.safetensors", 100)]
    wanted = files_for_shard(files, None, ShardSpec(2, 4, 1, 2))
    assert [f.name for f in wanted] == ["config.json", "model.safetensors"]


def test_unknown_tensors_outside_the_blocks_go_everywhere() -> None:
    middle = ShardSpec(2, 4, 1, 3)
    assert tensor_needed("model.rotary_emb.inv_freq", middle, tied=False)
    assert not tensor_needed("lm_head.weight", middle, tied=False)
    assert not tensor_needed("model.norm.weight", middle, tied=False)
    assert not tensor_needed("model.embed_tokens.weight", middle, tied=True)
    assert tensor_needed("language_model.model.layers.3.mlp.weight", middle, tied=False)
    # A decoder whose edges the sharding code does not know keeps them on every rank.
    assert tensor_needed("transformer.ln_f.weight", middle, tied=False, split_edges=False)
    assert tensor_needed("lm_head.weight", middle, tied=False, split_edges=False)


def test_missing_weight_files_names_what_the_rank_lacks() -> None:
    shard = ShardSpec(6, 8, 2, 3)
    present = ["model-00004-of-00004.safetensors", "config.json"]
    assert missing_weight_files(index(tied=True), shard, present) == [
        "model-00001-of-00004.safetensors"
    ]
    assert missing_weight_files(index(tied=False), shard, present) == []
    assert missing_weight_files(None, shard, ["config.json"]) == ["*.safetensors"]
    assert missing_weight_files(None, shard, ["model.safetensors"]) == []


@pytest.mark.parametrize(
    "bad", [{}, {"weight_map": []}, {"weight_map": {"a": 1}}, {"weight_map": {"a": None}}]
)
def test_an_index_without_a_usable_map_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="weight_map"):
        weight_map(bad)
