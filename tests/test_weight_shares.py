"""Where a model's weights are, for placement: exact from the weight files' headers, or
estimated from `config.json` by the architecture's shapes."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from trexo.weight_shares import config_shares, safetensors_sizes, tensor_shares

LLAMA_8B = {
    "hidden_size": 4096,
    "vocab_size": 128256,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
}


def test_a_mixture_of_experts_puts_its_experts_in_the_blocks() -> None:
    # Qwen3-30B-A3B: 48 blocks of 128 experts 768 wide; the embedding is ~1 % of the weights.
    qwen3_moe = {
        **LLAMA_8B,
        "hidden_size": 2048,
        "vocab_size": 151936,
        "num_hidden_layers": 48,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
    }
    shares = config_shares(qwen3_moe)
    assert shares is not None
    assert 0.009 < shares["embedding_fraction"] < 0.012  # 311 M of ~30.5 G
    dense = config_shares({k: v for k, v in qwen3_moe.items() if k != "num_experts"})
    assert dense is not None and dense["embedding_fraction"] > 0.08  # what a dense guess says


def test_latent_attention_and_first_dense_blocks_are_counted() -> None:
    # DeepSeek V3: 61 blocks, the first 3 dense, 256 routed experts and 1 shared.
    deepseek = {
        "hidden_size": 7168,
        "vocab_size": 129280,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "first_k_dense_replace": 3,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
    }
    shares = config_shares(deepseek)
    assert shares is not None
    embedding = 129280 * 7168
    total = embedding / shares["embedding_fraction"]
    assert 660e9 < total < 690e9  # 671 B parameters, the head untied
    assert shares["head_fraction"] == pytest.approx((embedding + 7168) / total)


def test_per_layer_embeddings_are_held_by_every_rank() -> None:
    gemma4 = {**LLAMA_8B, "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144}
    shares = config_shares(gemma4)
    assert shares is not None and shares.get("embedding_on_every_rank") is True
    assert "embedding_on_every_rank" not in (config_shares(LLAMA_8B) or {})


def test_tensors_are_sorted_into_embedding_blocks_and_head_by_name() -> None:
    shares = tensor_shares(
        [
            ("model.embed_tokens.weight", 100),
            ("model.embed_tokens.scales", 10),
            ("vision_tower.layers.0.mlp.weight", 40),  # rank 0's, with the embedding
            ("model.layers.0.self_attn.q_proj.weight", 300),
            ("model.layers.1.mlp.switch_mlp.down_proj.weight", 500),
            ("model.norm.weight", 5),
            ("lm_head.weight", 45),
        ]
    )
    assert shares == {
        "embedding_fraction": pytest.approx(150 / 1000),
        "head_fraction": pytest.approx(50 / 1000),
        "blocks_fraction": pytest.approx(800 / 1000),
    }
    tied = tensor_shares([("model.embed_tokens.weight", 100), ("model.layers.0.w", 100)])
    assert tied is not None and tied["head_fraction"] == pytest.approx(0.5)  # the embedding again
    assert tensor_shares([("model.embed_tokens.weight", 100)]) is None


def write_safetensors(path: Path, header: object) -> None:
    data = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(data)) + data)


def test_the_headers_of_every_weight_file_are_read(tmp_path: Path) -> None:
    write_safetensors(
        tmp_path / "model-1.safetensors",
        {"__metadata__": {"format": "mlx"}, "a": {"dtype": "F32", "data_offsets": [0, 64]}},
    )
    write_safetensors(tmp_path / "model-2.safetensors", {"b": {"data_offsets": [0, 8]}})
    assert sorted(safetensors_sizes(tmp_path) or []) == [("a", 64), ("b", 8)]


@pytest.mark.parametrize(
    "content",
    [
        b"",  # no length
        struct.pack("<Q", 1 << 40),  # a header larger than any real one
        struct.pack("<Q", 5) + b"[1,2]",  # not an object
        struct.pack("<Q", 20) + b'{"a": {"x": 1}}     ',  # no offsets
        struct.pack("<Q", 33) + b'{"a": {"data_offsets": [9, 1]}}  ',  # backwards
    ],
)
def test_a_header_that_cannot_be_read_gives_no_sizes(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "model.safetensors").write_bytes(content)
    assert safetensors_sizes(tmp_path) is None
    assert safetensors_sizes(tmp_path / "nowhere") is None
