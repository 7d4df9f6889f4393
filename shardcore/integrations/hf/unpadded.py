"""A batch known to be unpadded, told to a transformers model's mask builders: what a simulated rank
(:mod:`shardcore.cost.tracked`) needs to take the branch a real run takes.

transformers decides from the data whether a causal model needs a mask at all: an all-ones padding mask
(what a pipeline stage is handed when the batch has none) lets SDPA run ``is_causal`` with no mask, once
the mask has been read (``masking_utils._ignore_causal_mask_sdpa``). A fake tensor has no data, and
transformers takes one for a trace: it builds the whole ``[batch, 1, seq, seq]`` mask instead, and SDPA
converts it for every layer and keeps it for the backward, memory a real run never holds (a pipeline's
middle stage 13-17% over on Llama-3-8B's shapes). Under :func:`unpadded_masks` the builders get no
padding mask, transformers' own "no padding", and decide as they would after reading one of all ones.
"""

from __future__ import annotations

import contextlib
import functools

from torch import nn

__all__ = ["unpadded_masks"]

_PREFIX = "shardcore_unpadded_"


def _unpadded(builder):
    @functools.wraps(builder)
    def build(*args, **kwargs):
        kwargs["attention_mask"] = None  # every padding mask of the batch is all ones: none, in transformers' terms
        return builder(*args, **kwargs)

    return build


@contextlib.contextmanager
def unpadded_masks(model: nn.Module):
    """Within it, ``model``'s attention implementations (each config's ``_attn_implementation`` in
    transformers' registries, ``eager`` aside: its builder never skips the mask) run with mask builders that
    drop the padding mask; every config gets its implementation back on exit, and the names registered
    for it are removed. A model outside transformers' registries (or a transformers without them) runs as
    it is."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError:
        yield model
        return
    before = [(c, getattr(c, "_attn_implementation", None)) for c in _configs(model)]
    added = set()
    try:
        for config, name in before:
            if (
                name in (None, "eager")
                or name not in ALL_ATTENTION_FUNCTIONS
                or name not in ALL_MASK_ATTENTION_FUNCTIONS
            ):
                continue
            if _PREFIX + name not in AttentionInterface._global_mapping:
                AttentionInterface.register(_PREFIX + name, ALL_ATTENTION_FUNCTIONS[name])
                AttentionMaskInterface.register(_PREFIX + name, _unpadded(ALL_MASK_ATTENTION_FUNCTIONS[name]))
                added.add(_PREFIX + name)
            _set(config, _PREFIX + name)
        yield model
    finally:
        for config, name in before:
            if name is not None:
                _set(config, name)
        for name in added:
            AttentionInterface._global_mapping.pop(name, None)
            AttentionMaskInterface._global_mapping.pop(name, None)


def _configs(model: nn.Module) -> list:
    """Every config of ``model``'s modules and their sub-configs (a composite's text and vision configs), once."""
    found: dict[int, object] = {}
    stack = [c for m in model.modules() if (c := getattr(m, "config", None)) is not None]
    while stack:
        config = stack.pop()
        if id(config) not in found:
            found[id(config)] = config
            stack += [s for k in getattr(config, "sub_configs", {}) if (s := getattr(config, k, None)) is not None]
    return list(found.values())


def _set(config, name: str) -> None:
    """``config``'s attention implementation, its own only (transformers' setter hands it to every sub-config)."""
    if hasattr(config, "_attn_implementation_internal"):
        config._attn_implementation_internal = name
    else:
        config._attn_implementation = name
