"""What ``shardcore check`` builds on every rank: MODEL as a directory with a HuggingFace
``config.json``, ``module:Class`` (a HuggingFace class from its default config), or a module-level
callable returning the model; a model too large for this machine reduced to a size it runs, keeping
what the layout depends on.

Kept: the attention and key/value head counts, expert counts and top-k, the vocabulary, the layer
types' pattern (every type present), tied embeddings. Reduced: the number of layers (enough for the
pipeline stages and every layer type), the head dimension (8) and with it the hidden size, the MLP
and expert widths (twice the hidden size). Dropout is set to 0 everywhere (the check compares
numbers; a dropout mask differs between the sharded and the unsharded model by design). The check
computes in float32 whatever the config's dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from torch import nn

__all__ = ["REDUCE_ABOVE", "ModelSource", "reduce_config"]

#: parameters above which a HuggingFace model is checked reduced (16 bytes each for a model, its
#: gradient and AdamW's two states, twice: the unsharded reference beside the sharded copy)
REDUCE_ABOVE = 50_000_000
HEAD_DIM = 8
_WIDTHS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "ffn_dim")


@attrs.frozen
class ModelSource:
    """How each rank builds the model: ``spec`` a config directory, ``"module:Class"`` or a
    module-level callable; ``reduce`` True / False / None (None: reduce a HuggingFace model above
    :data:`REDUCE_ABOVE` parameters); ``layers``: the reduced model's layer count (default: as few
    as the pipeline stages and the layer types need)."""

    spec: Any
    reduce: bool | None = None
    layers: int | None = None
    pp: int = 1

    def config(self):
        """The HuggingFace config the model is built from and its class (``None, None`` for a callable;
        ``None, target`` for a ``module:function``)."""
        if callable(self.spec):
            return None, None
        from ..explain.source import model_source

        return model_source(self.spec, "check")

    def plan(self) -> tuple[Any, Callable[[], nn.Module], dict[str, tuple[Any, Any]]]:
        """``(config, build, reduced)``: what is built, how, and each field reduced ``{field: (was, now)}``."""
        config, cls = self.config()
        if config is None:
            target = self.spec if callable(self.spec) else cls
            return None, target, {}
        reduced: dict[str, tuple[Any, Any]] = {}
        _no_dropout(config)
        if self.reduce or (self.reduce is None and _parameters(cls, config) > REDUCE_ABOVE):
            reduced = reduce_config(config, pp=self.pp, layers=self.layers)
        return config, lambda: cls._from_config(config).float(), reduced

    def build(self) -> nn.Module:
        return self.plan()[1]()


def _parameters(cls, config) -> int:
    """The model's parameter count, built on the meta device (nothing allocated)."""
    from ..meta import init_empty

    with init_empty():
        model = cls._from_config(config)
    return sum(p.numel() for p in model.parameters())


def _configs(config) -> list:
    """``config`` and the configs nested in it (a text and a vision config, an encoder's)."""
    found = [config]
    for value in vars(config).values():
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):
            found += _configs(value)
    return found


def _no_dropout(config) -> None:
    for c in _configs(config):
        for key, value in list(vars(c).items()):
            if "dropout" in key and isinstance(value, float):
                setattr(c, key, 0.0)


def _layer_count(c, pp: int, layers: int | None) -> int:
    """Layers to keep: ``layers``, else as few as give each stage 2 blocks and include every layer
    type (a multiple of ``pp``)."""
    if layers is not None:
        return layers
    n, types = max(2 * pp, 2), getattr(c, "layer_types", None)
    while types and set(types[:n]) != set(types) and n < len(types):
        n += 1
    return -(-n // pp) * pp


def reduce_config(config, *, pp: int = 1, layers: int | None = None) -> dict[str, tuple[Any, Any]]:
    """Reduce ``config`` (and its nested configs) in place as the module says; returns what changed."""
    changed: dict[str, tuple[Any, Any]] = {}

    def put(c, key: str, value) -> None:
        was = getattr(c, key)
        if was != value:
            setattr(c, key, value)
            prefix = "" if c is config else f"{c.model_type}."
            changed[prefix + key] = (was, value)

    for c in _configs(config):
        heads = getattr(c, "num_attention_heads", None)
        if not isinstance(heads, int) or not isinstance(getattr(c, "hidden_size", None), int):
            continue
        total = getattr(c, "num_hidden_layers", None)
        if isinstance(total, int):
            n = min(total, _layer_count(c, pp, layers))
            put(c, "num_hidden_layers", n)
            if isinstance(getattr(c, "layer_types", None), list):
                put(c, "layer_types", c.layer_types[:n])
        if isinstance(getattr(c, "head_dim", None), int):
            put(c, "head_dim", HEAD_DIM)
        put(c, "hidden_size", heads * HEAD_DIM)
        for key in _WIDTHS:
            if isinstance(getattr(c, key, None), int):
                put(c, key, 2 * c.hidden_size)
    return changed
