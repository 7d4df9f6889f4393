"""A HuggingFace config's attention shape, as the decoder families spell it."""

from __future__ import annotations

import math

__all__ = ["attention_dims", "sequence_heads"]


def attention_dims(config) -> tuple[int, int, int]:
    """``(attention heads, key/value heads, head dim)`` of a HuggingFace config: ``num_attention_heads``,
    ``num_key_value_heads`` (absent or ``None``: as many as the heads) and ``head_dim`` (absent or ``None``:
    ``hidden_size // heads``), as Llama, Mistral, Qwen, the MoE decoders and GLM read them."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    return heads, kv, getattr(config, "head_dim", None) or config.hidden_size // heads


def sequence_heads(config) -> tuple[int, int] | None:
    """``(attention heads, key/value heads)`` that every layer's counts are multiples of: the config's, or
    where transformers gives each layer its own shape (``per_layer_config``: Gemma 4's head widths, a
    config whose head counts vary) the greatest common divisor over the layers, so that a group size
    dividing both divides every layer's. ``None``: the config names no heads (a composite's)."""
    try:
        return attention_dims(config)[:2]
    except AttributeError:
        return None
    except RuntimeError:  # transformers' AmbiguousGlobalPerLayerAttributeError: read each layer's
        layers = [attention_dims(c)[:2] for c in config.per_layer_config]
        return math.gcd(*(h for h, _ in layers)), math.gcd(*(k for _, k in layers))
