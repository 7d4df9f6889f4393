"""Tiny mixture-of-experts configs and batches (random weights, fp32, dropout 0): 4 experts, top-2,
the load-balancing loss in the loss (``output_router_logits=True``)."""

from __future__ import annotations

VOCAB = 128


def moe_config(family: str = "mixtral", *, experts: int = 4, top_k: int = 2, heads: int = 4, kv: int = 2, **extra):
    import transformers

    common = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "max_position_embeddings": 64,
        "attention_dropout": 0.0,
        "output_router_logits": True,
        "router_aux_loss_coef": 0.02,
        "pad_token_id": 0,
    }
    if family == "mixtral":
        cfg = transformers.MixtralConfig(
            intermediate_size=96, num_local_experts=experts, num_experts_per_tok=top_k, **common
        )
    elif family == "qwen2_moe":
        cfg = transformers.Qwen2MoeConfig(
            intermediate_size=96,
            moe_intermediate_size=48,
            shared_expert_intermediate_size=96,
            num_experts=experts,
            num_experts_per_tok=top_k,
            norm_topk_prob=False,
            **common,
        )
    elif family == "olmoe":
        cfg = transformers.OlmoeConfig(intermediate_size=48, num_experts=experts, num_experts_per_tok=top_k, **common)
    else:
        cfg = transformers.Qwen3MoeConfig(
            intermediate_size=96,
            moe_intermediate_size=48,
            num_experts=experts,
            num_experts_per_tok=top_k,
            norm_topk_prob=True,
            head_dim=16,
            **common,
        )
    for key, value in extra.items():
        setattr(cfg, key, value)
    return cfg


def build(family: str = "mixtral", **cfg):
    import transformers

    config = moe_config(family, **cfg)
    config._attn_implementation = "sdpa"
    prefix = {"mixtral": "Mixtral", "qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe", "olmoe": "Olmoe"}[family]
    return getattr(transformers, f"{prefix}ForCausalLM")(config).float()


def lm_batch(batch: int = 2, seq: int = 12, seed: int = 1, pad: bool = True) -> dict:
    """Token ids with left padding on the first row (masked, labels ignored), labels = ids."""
    from shardcore.testing import token_batch

    return token_batch(VOCAB, batch, seq, seed=seed, pad=pad)
