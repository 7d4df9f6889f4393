"""Tiny Llama-architecture models and batches for shard-llama's tests (random weights, fp32, dropout 0)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def llama_config(
    family: str = "llama",
    *,
    vocab: int = 128,
    heads: int = 4,
    kv: int | None = None,
    hidden: int = 64,
    intermediate: int = 128,
    layers: int = 2,
    tie: bool = False,
    **extra,
):
    import transformers

    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig, "qwen2": transformers.Qwen2Config}[
        family
    ]
    return cls(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv or heads,
        max_position_embeddings=128,
        tie_word_embeddings=tie,
        attention_dropout=0.0,
        pad_token_id=0,
        **extra,
    )


def build(cls_name: str, family: str = "llama", **cfg):
    import transformers

    config = llama_config(family, **cfg)
    config._attn_implementation = "sdpa"
    return getattr(transformers, cls_name)(config).float()


def lm_batch(vocab: int = 128, batch: int = 2, seq: int = 12, seed: int = 1, pad: bool = True) -> dict:
    """Token ids with left padding on the first row (masked, labels ignored), labels = ids."""
    from shardcore.testing import token_batch

    return token_batch(vocab, batch, seq, seed=seed, pad=pad)


def gather_vocab_logits(model, output):
    """All-gather logits kept vocab-parallel (parallel_output=True) into full-vocab logits."""
    head = model.lm_head
    local = output.logits
    width = head.spec.segments[0].shard_len
    padded = F.pad(local, (0, width - local.shape[-1]))
    parts = [torch.empty_like(padded) for _ in range(head.tp_size)]
    dist.all_gather(parts, padded.contiguous(), group=head.process_group)
    full = torch.cat(parts, dim=-1)[..., : head.out_features]
    return {"loss": output.loss, "logits": full}


def over_sp_refused_before_v5(world: int, config: dict) -> bool:
    """transformers 4.x has no attention and mask registries, which the modes over the sp dim
    (all_to_all, ring_attn, all_gather_kv) run attention through: there such a layout is refused
    by name on every rank before any collective, which is checked (``True``: the caller skips)."""
    import transformers

    from shardcore.testing import run_on_ranks

    mode = config.get("sequence_parallelism_mode")
    if int(transformers.__version__.split(".")[0]) >= 5 or mode not in ("all_to_all", "ring_attn", "all_gather_kv"):
        return False
    for message in run_on_ranks(world, _over_sp_refusal, config):
        assert message.startswith("NotImplementedError") and mode in message and "registr" in message, message
    return True


def _over_sp_refusal(config: dict) -> str:
    from shardcore import ShardConfig
    from shardcore.testing import refusal_message

    return refusal_message(lambda: build("LlamaForCausalLM"), ShardConfig(**config))
