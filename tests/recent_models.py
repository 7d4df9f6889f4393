"""Tiny configs of the families people train in 2026 that no plugin covers (zero-config: the plan each
config ships), built with random weights: Qwen3, Gemma 3 (sliding and full layers), OLMo-2, Phi-3,
GPT-OSS, DeepSeek-V3 (MoE, grouped top-k, MLA attention), Qwen3-MoE, LongCat-Flash (zero-computation experts), the
hybrids MiniMax, Qwen3-Next, Falcon-H1 and Nemotron-H (linear attention, Mamba-2 mixers), Ministral 3 and
Beam (queries scaled per position)."""

from __future__ import annotations

import torch

#: what every family shares: 4 query heads over 2 key/value heads, 2 layers
COMMON = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
LAYERS = ["sliding_attention", "full_attention"]
MIXED = ["linear_attention", "full_attention"]  # a hybrid's: a linear-attention layer, then an attention layer
#: DeepSeek-V3's own fields (MoE with a dense first layer, grouped top-k, MLA attention)
FAMILIES_V3 = {
    "moe_intermediate_size": 32,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 2,
    "topk_group": 1,
    "first_k_dense_replace": 1,  # layer 0 dense, layer 1 MoE
    "num_key_value_heads": 4,  # MLA expands its latent to every head (transformers' sdpa repeats K/V by
    # heads // kv_heads after that expansion whenever a mask is built: as many as the heads, as the real model)
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,  # narrower than the keys' 16 (8 + 8), as the real model's 128 against 192
}
#: each family's config class, model class, its own fields and attention implementation
FAMILIES = {
    "Qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}, "sdpa"),
    "Gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {"head_dim": 16, "sliding_window": 4, "layer_types": LAYERS},
        "sdpa",
    ),
    "Olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}, "sdpa"),
    "Phi3": ("Phi3Config", "Phi3ForCausalLM", {}, "sdpa"),
    "GptOss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 4, "layer_types": LAYERS},
        "eager",  # its attention sinks: no sdpa in transformers
    ),
    "DeepseekV3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        FAMILIES_V3,
        "sdpa",
    ),
    "Qwen3Moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",  # every layer MoE, no shared expert
        {
            "head_dim": 16,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "initializer_range": 0.1,
        },
        "sdpa",
    ),
    # hybrids: token mixers outside the attention, run over the whole sequence under Ulysses and the ring
    "MiniMax": (
        "MiniMaxConfig",
        "MiniMaxForCausalLM",  # lightning (linear) attention in its first layer, no convolution
        {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "block_size": 4, "layer_types": MIXED},
        "sdpa",
    ),
    "Qwen3Next": (
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",  # a Gated DeltaNet (a short convolution, then a gated delta rule) in its first
        {
            "head_dim": 16,
            "layer_types": MIXED,
            "linear_num_value_heads": 4,
            "linear_num_key_heads": 2,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
            "initializer_range": 0.1,
        },
        "sdpa",
    ),
    "FalconH1": (
        "FalconH1Config",
        "FalconH1ForCausalLM",  # a Mamba-2 mixer beside the attention in every layer
        {
            "head_dim": 16,
            "mamba_d_ssm": 64,
            "mamba_d_state": 8,
            "mamba_n_heads": 4,
            "mamba_d_head": 16,
            "mamba_n_groups": 1,
            "mamba_d_conv": 4,
            "mamba_chunk_size": 8,
            "initializer_range": 0.1,
        },
        "sdpa",
    ),
    "NemotronH": (
        "NemotronHConfig",
        "NemotronHForCausalLM",  # one mixer a layer: Mamba-2, an MLP alone (no token mixing), attention
        {
            "head_dim": 16,
            "layer_types": ["linear_attention", "mlp", "full_attention"],
            "mamba_num_heads": 4,
            "mamba_head_dim": 16,
            "ssm_state_size": 8,
            "n_groups": 1,
            "chunk_size": 8,
            "time_step_min": 0.05,
            "time_step_max": 0.5,
            "initializer_range": 0.1,
        },
        "sdpa",
    ),
    "NemotronHMoe": (
        "NemotronHConfig",
        "NemotronHForCausalLM",  # its MoE layer: experts with an up projection and no gate, a shared expert
        {
            "head_dim": 16,
            "layer_types": ["moe", "full_attention"],
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "moe_shared_expert_intermediate_size": 32,
            "initializer_range": 0.1,
        },
        "sdpa",
    ),
    "Ministral3": (
        "Ministral3Config",
        "Ministral3ForCausalLM",  # its queries scaled by their positions (position_ids)
        {
            "head_dim": 16,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "llama_4_scaling_beta": 0.1,
                "original_max_position_embeddings": 4,  # so that the scale differs along 16 tokens
            },
        },
        "sdpa",
    ),
    "Beam": (
        "BeamConfig",
        "BeamForCausalLM",  # its full layers without rotary, their queries scaled per position (1, 1, sequence, 1)
        {"head_dim": 16, "sliding_window": 4, "layer_types": LAYERS},
        "sdpa",
    ),
    "Dory": (
        "DoryConfig",
        "DoryForCausalLM",  # a looped model: input layer, a middle layer run twice a forward, output layer
        {"head_dim": 16, "n_input_layers": 1, "n_output_layers": 1, "n_recurrent_loops": 2},
        "sdpa",
    ),
    "DeepseekV32": (
        "DeepseekV32Config",
        "DeepseekV32ForCausalLM",  # DeepSeek-V3's shapes with a sparse-attention indexer, which gets no gradient
        {**FAMILIES_V3, "index_n_heads": 2, "index_head_dim": 16, "index_topk": 8},
        "sdpa",
    ),
    "LongcatFlash": (
        "LongcatFlashConfig",
        "LongcatFlashForCausalLM",
        {
            "num_layers": 2,  # its own name for the layer count (two attentions and MLPs a layer)
            "num_key_value_heads": 4,
            "q_lora_rank": 32,
            "kv_lora_rank": 16,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "head_dim": 8,
            "v_head_dim": 8,
            "ffn_hidden_size": 128,
            "expert_ffn_hidden_size": 32,
            "n_routed_experts": 4,
            "zero_expert_num": 256,  # most tokens go to the zero-computation (identity) experts
            "moe_topk": 2,
            "initializer_range": 0.1,
        },
        "sdpa",
    ),
}


def config(family: str, layers: int = 2):
    import transformers

    config_class, _, own, attention = FAMILIES[family]
    own = dict(own)
    count = {"num_hidden_layers": layers}
    if "num_layers" in own:  # its own name for the layer count (LongCat-Flash: num_hidden_layers counts sublayers)
        count = {"num_layers": layers}
    if own.get("layer_types") in (LAYERS, MIXED):  # the two kinds in turn
        own["layer_types"] = [own["layer_types"][i % 2] for i in range(layers)]
    config = getattr(transformers, config_class)(
        **{k: v for k, v in COMMON.items() if k != "num_hidden_layers"} | own | count
    )
    config._attn_implementation = attention
    return config


def build(family: str, layers: int = 2) -> torch.nn.Module:
    import transformers

    return getattr(transformers, FAMILIES[family][1])(config(family, layers)).float()


def batch(seed: int = 0, seq: int = 12, rows: int = 2) -> dict:
    ids = torch.randint(3, COMMON["vocab_size"], (rows, seq), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "labels": ids}
