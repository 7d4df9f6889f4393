"""The plan style ``neox_qkv``: a fused ``query_key_value`` whose output is ``[q; k; v]`` per head (GPT-NeoX,
Pythia), split by whole heads. transformers' ``colwise`` splits the same weight evenly, which cuts a head
in two wherever the heads do not divide the group; this style refuses that by name. Registered with
shardcore through the entry point ``shardcore.styles`` (pyproject.toml): a plan naming it loads it."""

from __future__ import annotations

from shardcore.plugin_api import NOT_HERE, Linear1D_Col, Style

__all__ = ["NEOX_QKV", "qkv_layer"]


def qkv_layer(projection, head_size: int, **kwargs) -> tuple[type, dict]:
    """``(Linear1D_Col, kwargs)`` splitting ``projection`` (``3 x heads x head_size`` outputs) by whole heads."""
    heads = projection.out_features // (3 * head_size)
    return Linear1D_Col, {"num_heads": heads, "head_dim": 3 * head_size, **kwargs}


def _module(site):
    head_size = getattr(site.parent, "head_size", None)
    if not (site.plain_linear and isinstance(head_size, int) and site.module.out_features % (3 * head_size) == 0):
        return NOT_HERE
    return qkv_layer(site.module, head_size)


NEOX_QKV = Style("neox_qkv", module=_module, role="column", applies_to="a GPT-NeoX attention's query_key_value")
