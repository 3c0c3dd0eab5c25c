"""The architectures of the model zoo: one tiny `config.json` per mlx-lm model class.

Every zoo model shares the demo model's tokenizer (vocabulary 2048) and a common small shape
(hidden 64, 4 blocks, 4 query heads of 16 over 2 KV heads); each architecture adds what makes
it itself — its sliding-window layers or hybrid layer pattern, its mixture of experts, MLA,
gating — with the real models' defaults where they matter and small numbers where they cost:
a sliding window of 8 tokens (any chat prompt is longer), 4 experts of which 2 are routed.
Four blocks let a pipeline split over 3 ranks; the layer patterns (a global block every 3rd
or 4th) are not periodic over a rank's share, so a rank after the first that took a block's
type from its local index would take the wrong one.

`block_scale` multiplies the blocks' weight matrices (`trexo.engine.zoo`): at 3 every
family's greedy output is varied (measured: README, "The demo model"); where a norm sits on
a block's output (`post_norms`) it multiplies that norm's scale instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

HIDDEN_SIZE = 64
NUM_LAYERS = 4
"""Enough for a pipeline over 3 ranks."""
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = 16
INTERMEDIATE_SIZE = 128
EXPERT_INTERMEDIATE_SIZE = 64
NUM_EXPERTS = 4
EXPERTS_PER_TOKEN = 2
SLIDING_WINDOW = 8
"""Tokens a sliding-window layer sees: shorter than any chat-templated prompt of a test, so
that the window, not the whole prompt, is what such a layer attends to."""
MAX_POSITION_EMBEDDINGS = 4096
DEFAULT_BLOCK_SCALE = 3.0


@attrs.frozen
class ZooArch:
    """One architecture of the zoo: its `config.json` fields beyond the common shape."""

    name: str
    config: Mapping[str, Any]
    """Fields of the (text) config: `model_type` selects the mlx-lm module."""
    about: str
    """What the architecture brings that the others do not (for `--arch list`)."""
    block_scale: float = DEFAULT_BLOCK_SCALE
    post_norms: tuple[str, ...] = ()
    """Norms on a block's output before the residual sum: a norm there hides the scale of
    the matrices before it, so its own scale gets `block_scale` instead."""
    wrapper: Mapping[str, Any] | None = None
    """For vision-language wrappers: the outer config's fields; the text config goes under
    `text_config`, as the real checkpoints nest it."""


COMMON: Mapping[str, Any] = MappingProxyType(
    {
        "hidden_size": HIDDEN_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "intermediate_size": INTERMEDIATE_SIZE,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    }
)
"""Fields every text config starts from (an architecture's own fields replace them)."""

MOE: Mapping[str, Any] = MappingProxyType(
    {"num_experts_per_tok": EXPERTS_PER_TOKEN, "moe_intermediate_size": EXPERT_INTERMEDIATE_SIZE}
)

GATED_DELTA_NET: Mapping[str, Any] = MappingProxyType(
    {
        "full_attention_interval": 4,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": HEAD_DIM,
        "linear_value_head_dim": HEAD_DIM,
        "linear_conv_kernel_dim": 4,
    }
)
"""Qwen3-Next's and Qwen3.5's linear-attention blocks, a full-attention block every 4th."""
GRANITE_MULTIPLIERS: Mapping[str, Any] = MappingProxyType(
    {
        "embedding_multiplier": 12.0,
        "attention_multiplier": 1.0 / HEAD_DIM,
        "residual_multiplier": 0.22,
        "logits_scaling": 8.0,
    }
)
"""Granite 3's (2B) scales, with attention's for this head size."""


def _arch(
    name: str,
    about: str,
    block_scale: float = DEFAULT_BLOCK_SCALE,
    post_norms: tuple[str, ...] = (),
    **config: Any,
) -> ZooArch:
    return ZooArch(name, MappingProxyType(config), about, block_scale, post_norms)


_ARCHS = (
    _arch(
        "llama",
        "Llama 3: llama3 RoPE scaling, untied head",
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
        tie_word_embeddings=False,
    ),
    _arch(
        "mistral",
        "Mistral 7B v0.3 (mlx-lm loads model_type mistral as llama)",
        model_type="mistral",
        architectures=["MistralForCausalLM"],
        rope_theta=1000000.0,
        sliding_window=None,
        tie_word_embeddings=False,
    ),
    _arch(
        "mixtral",
        "sparse mixture of experts (block_sparse_moe)",
        model_type="mixtral",
        architectures=["MixtralForCausalLM"],
        num_local_experts=NUM_EXPERTS,
        num_experts_per_tok=EXPERTS_PER_TOKEN,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
    ),
    _arch(
        "qwen2",
        "biases on q, k and v",
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        rope_theta=1000000.0,
    ),
    _arch(
        "qwen3",
        "RMS norms on queries and keys",
        model_type="qwen3",
        architectures=["Qwen3ForCausalLM"],
        rope_theta=1000000.0,
    ),
    _arch(
        "qwen3_moe",
        "Qwen3 with a mixture of experts in every block",
        model_type="qwen3_moe",
        architectures=["Qwen3MoeForCausalLM"],
        num_experts=NUM_EXPERTS,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        **MOE,
    ),
    _arch(
        "qwen3_next",
        "hybrid: gated delta-net linear attention, full attention every 4th block, experts",
        model_type="qwen3_next",
        architectures=["Qwen3NextForCausalLM"],
        **GATED_DELTA_NET,
        num_experts=NUM_EXPERTS,
        decoder_sparse_step=1,
        shared_expert_intermediate_size=EXPERT_INTERMEDIATE_SIZE,
        mlp_only_layers=[],
        norm_topk_prob=True,
        partial_rotary_factor=0.25,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        **MOE,
    ),
    _arch(
        "gemma2",
        "soft-capped logits, pre and post norms (mlx-lm gives every layer a full cache)",
        model_type="gemma2",
        architectures=["Gemma2ForCausalLM"],
        query_pre_attn_scalar=HEAD_DIM,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        sliding_window=SLIDING_WINDOW,
        hidden_activation="gelu_pytorch_tanh",
    ),
    _arch(
        "gemma3_text",
        "sliding-window layers (8 tokens), every 3rd block global",
        model_type="gemma3_text",
        architectures=["Gemma3ForCausalLM"],
        query_pre_attn_scalar=HEAD_DIM,
        sliding_window=SLIDING_WINDOW,
        sliding_window_pattern=3,
        rope_local_base_freq=10000.0,
        rope_theta=1000000.0,
    ),
    _arch(
        "phi3",
        "fused qkv and gate-up projections, untied head",
        model_type="phi3",
        architectures=["Phi3ForCausalLM"],
        tie_word_embeddings=False,
    ),
    _arch(
        "olmo2",
        "norms after attention and MLP, q/k norms over all heads",
        model_type="olmo2",
        architectures=["Olmo2ForCausalLM"],
        tie_word_embeddings=False,
    ),
    _arch(
        "glm4",
        "partial rotary, biased attention, post norms",
        model_type="glm4",
        architectures=["Glm4ForCausalLM"],
        attention_bias=True,
        partial_rotary_factor=0.5,
        tie_word_embeddings=False,
    ),
    _arch(
        "glm4_moe",
        "GLM-4.5: a dense first block, then routed and shared experts (sigmoid router)",
        model_type="glm4_moe",
        architectures=["Glm4MoeForCausalLM"],
        n_routed_experts=NUM_EXPERTS,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        routed_scaling_factor=1.0,
        norm_topk_prob=True,
        use_qk_norm=True,
        attention_bias=True,
        partial_rotary_factor=0.5,
        rope_scaling=None,
        tie_word_embeddings=False,
        **MOE,
    ),
    _arch(
        "deepseek_v3",
        "multi-head latent attention (MLA), grouped expert routing, a dense first block",
        model_type="deepseek_v3",
        architectures=["DeepseekV3ForCausalLM"],
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=HEAD_DIM,
        v_head_dim=HEAD_DIM,
        num_key_value_heads=NUM_HEADS,
        n_routed_experts=NUM_EXPERTS,
        n_shared_experts=1,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
        moe_layer_freq=1,
        routed_scaling_factor=1.0,
        norm_topk_prob=True,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        tie_word_embeddings=False,
        **MOE,
    ),
    _arch(
        "gpt_oss",
        "alternating sliding-window (8 tokens) and full layers, attention sinks, experts",
        model_type="gpt_oss",
        architectures=["GptOssForCausalLM"],
        num_local_experts=NUM_EXPERTS,
        num_experts_per_tok=EXPERTS_PER_TOKEN,
        intermediate_size=EXPERT_INTERMEDIATE_SIZE,
        sliding_window=SLIDING_WINDOW,
        layer_types=["sliding_attention", "full_attention"] * (NUM_LAYERS // 2),
        rope_theta=150000.0,
        tie_word_embeddings=False,
    ),
    _arch(
        "minimax",
        "MiniMax M2: experts with a sigmoid router, partial rotary, q/k norms",
        model_type="minimax",
        architectures=["MiniMaxM2ForCausalLM"],
        num_local_experts=NUM_EXPERTS,
        num_experts_per_tok=EXPERTS_PER_TOKEN,
        intermediate_size=EXPERT_INTERMEDIATE_SIZE,
        shared_intermediate_size=0,
        rotary_dim=HEAD_DIM // 2,
        use_qk_norm=True,
        scoring_func="sigmoid",
        tie_word_embeddings=False,
    ),
    _arch(
        "cohere2",
        "Command R7B: sliding-window layers (8 tokens) with RoPE, every 4th global without",
        model_type="cohere2",
        architectures=["Cohere2ForCausalLM"],
        sliding_window=SLIDING_WINDOW,
        sliding_window_pattern=4,
        layer_norm_eps=1e-5,
        logit_scale=0.25,
    ),
    _arch(
        "granite",
        "embedding, attention, residual and logit multipliers",
        model_type="granite",
        architectures=["GraniteForCausalLM"],
        **GRANITE_MULTIPLIERS,
        attention_bias=False,
        mlp_bias=False,
    ),
    _arch(
        "granitemoehybrid",
        "Granite 4.0-H: Mamba-2 blocks around an attention block, experts with a shared one",
        model_type="granitemoehybrid",
        architectures=["GraniteMoeHybridForCausalLM"],
        layer_types=["mamba", "mamba", "attention", "mamba"],
        mamba_n_heads=8,
        mamba_d_head=HEAD_DIM,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_n_groups=1,
        mamba_proj_bias=False,
        mamba_conv_bias=True,
        num_local_experts=NUM_EXPERTS,
        num_experts_per_tok=EXPERTS_PER_TOKEN,
        intermediate_size=EXPERT_INTERMEDIATE_SIZE,
        shared_intermediate_size=EXPERT_INTERMEDIATE_SIZE,
        **GRANITE_MULTIPLIERS,
        attention_bias=False,
        position_embedding_type="nope",
    ),
    _arch(
        "lfm2",
        "LFM2: short gated convolutions (a state cache) around attention blocks",
        model_type="lfm2",
        architectures=["Lfm2ForCausalLM"],
        layer_types=["conv", "conv", "full_attention", "conv"],
        block_dim=HIDDEN_SIZE,
        block_ff_dim=INTERMEDIATE_SIZE,
        block_multiple_of=32,
        block_ffn_dim_multiplier=1.0,
        block_auto_adjust_ff_dim=False,
        conv_bias=False,
        conv_L_cache=3,
        norm_eps=1e-5,
    ),
    _arch(
        "smollm3",
        "llama with no RoPE in every 4th block",
        model_type="smollm3",
        architectures=["SmolLM3ForCausalLM"],
        no_rope_layer_interval=4,
    ),
    _arch(
        "starcoder2",
        "layer norms and MLP with biases, GELU",
        model_type="starcoder2",
        architectures=["Starcoder2ForCausalLM"],
        norm_epsilon=1e-5,
        use_bias=True,
    ),
    _arch(
        "olmo3",
        "Olmo 3: sliding-window layers (8 tokens), every 4th block full",
        model_type="olmo3",
        architectures=["Olmo3ForCausalLM"],
        sliding_window=SLIDING_WINDOW,
        tie_word_embeddings=False,
    ),
    _arch(
        "exaone4",
        "EXAONE 4.0: local (8-token window) and global layers by a pattern string",
        model_type="exaone4",
        architectures=["Exaone4ForCausalLM"],
        sliding_window=SLIDING_WINDOW,
        sliding_window_pattern="LLG",
        # As the real configs list them: transformers cannot derive them from a string.
        layer_types=[
            "sliding_attention" if "LLG"[i % 3] == "L" else "full_attention"
            for i in range(NUM_LAYERS)
        ],
        rope_scaling=None,
    ),
    _arch(
        "ernie4_5_moe",
        "ERNIE 4.5 MoE: a dense first block, then experts with a shared one",
        model_type="ernie4_5_moe",
        architectures=["Ernie4_5_MoeForCausalLM"],
        use_bias=False,
        moe_num_experts=NUM_EXPERTS,
        moe_k=EXPERTS_PER_TOKEN,
        moe_intermediate_size=EXPERT_INTERMEDIATE_SIZE,
        moe_layer_start_index=1,
        moe_num_shared_experts=1,
        moe_use_aux_free=True,
        rope_theta=500000.0,
    ),
    _arch(
        "gemma4_text",
        "Gemma 4: per-layer inputs, sliding-window layers (8 tokens), the last 2 of 6 blocks "
        "reusing earlier blocks' keys and values",
        post_norms=(
            "post_attention_layernorm",
            "post_feedforward_layernorm",
            "post_per_layer_input_norm",
        ),
        model_type="gemma4_text",
        architectures=["Gemma4ForCausalLM"],
        num_hidden_layers=6,
        sliding_window=SLIDING_WINDOW,
        sliding_window_pattern=3,
        num_kv_shared_layers=2,
        global_head_dim=2 * HEAD_DIM,
        hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=2048,
        use_double_wide_mlp=True,
        final_logit_softcapping=30.0,
    ),
)


_QWEN3_5_TEXT = _arch(
    "qwen3_5_text",
    "Qwen3.5's text model",
    model_type="qwen3_5_text",
    **GATED_DELTA_NET,
    rope_parameters={
        "type": "default",
        "mrope_section": [1, 1, 0],
        "rope_theta": 1000000.0,
        "partial_rotary_factor": 0.25,
    },
    tie_word_embeddings=False,
)
_MINISTRAL3 = _arch(
    "ministral3",
    "Ministral 3's text model",
    model_type="ministral3",
    sliding_window=None,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 1000000.0,
        "factor": 4.0,
        "original_max_position_embeddings": MAX_POSITION_EMBEDDINGS // 4,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "llama_4_scaling_beta": 0.1,
    },
    tie_word_embeddings=False,
)


def _wrapped(text: ZooArch, name: str, architecture: str, about: str) -> ZooArch:
    """`text` in its vision-language wrapper `name`, text only (no vision tower)."""
    wrapper = {"model_type": name, "architectures": [architecture]}
    return attrs.evolve(text, name=name, about=about, wrapper=MappingProxyType(wrapper))


_WRAPPED = (
    _wrapped(
        next(arch for arch in _ARCHS if arch.name == "gemma3_text"),
        "gemma3",
        "Gemma3ForConditionalGeneration",
        "Gemma 3's vision-language wrapper, text only: its blocks under language_model",
    ),
    _wrapped(
        _QWEN3_5_TEXT,
        "qwen3_5",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3.5 (dense): gated delta-net and full attention, wrapped as a vision model",
    ),
    _wrapped(
        _MINISTRAL3,
        "mistral3",
        "Mistral3ForConditionalGeneration",
        "Ministral 3 in Mistral 3's vision-language wrapper, text only: "
        "its blocks under language_model.model",
    ),
)

ZOO_ARCHS: Mapping[str, ZooArch] = MappingProxyType(
    {arch.name: arch for arch in sorted((*_ARCHS, *_WRAPPED), key=lambda a: a.name)}
)
ZOO_ARCH_NAMES: tuple[str, ...] = tuple(ZOO_ARCHS)
