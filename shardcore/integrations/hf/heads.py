"""A HuggingFace config's attention shape, as the decoder families spell it."""

from __future__ import annotations

__all__ = ["attention_dims"]


def attention_dims(config) -> tuple[int, int, int]:
    """``(attention heads, key/value heads, head dim)`` of a HuggingFace config: ``num_attention_heads``,
    ``num_key_value_heads`` (absent or ``None``: as many as the heads) and ``head_dim`` (absent or ``None``:
    ``hidden_size // heads``), as Llama, Mistral, Qwen, the MoE decoders and GLM read them."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    return heads, kv, getattr(config, "head_dim", None) or config.hidden_size // heads
