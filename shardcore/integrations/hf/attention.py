"""HuggingFace's attention registry: how ``enable_flash_attention`` and the sequence-parallel attention modes
switch a transformers model's attention (``set_attn_implementation``, the ``AttentionInterface`` /
``AttentionMaskInterface`` registries), and shardcore's own SDPA entry; an unpadded batch told to its mask builders.

Registered with the core when shardcore is imported (:data:`REGISTRY`); the core's
:func:`shardcore.kernels.attention_registry` hands it to the policies. Nothing here imports
transformers at import time: each function imports it when a model asks.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import textwrap

import torch

from ...kernels import announce_attention, register_attention_registry
from .unpadded import unpadded_masks

__all__ = [
    "HF_SDPA",
    "REGISTRY",
    "bias_passers",
    "hf_attention_switchable",
    "hf_sdpa_attention",
    "hf_sdpa_name",
    "mask_readers",
    "reads_registry",
    "tensor_inputs",
    "ulysses_problem",
    "use_hf_attention",
    "use_ulysses_attention",
]


#: The name shardcore's SDPA function is registered under in transformers' attention registries.
HF_SDPA = "shardcore_sdpa"


def hf_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA attention, except that grouped-query attention with a mask on the CPU runs
    ``scaled_dot_product_attention(..., enable_gqa=True)`` on the un-repeated K/V (transformers materializes
    ``num_key_value_groups`` copies of them there). Everything else is transformers' own function."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plain = all(kwargs.get(k) is None for k in ("position_bias", "softcap", "s_aux", "sinks", "cache"))
    if plain and attention_mask is not None and query.device.type == "cpu" and query.shape[1] != key.shape[1]:
        announce_attention("sdpa (torch scaled_dot_product_attention, grouped K/V not repeated)")
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
        )
        return out.transpose(1, 2).contiguous(), None
    announce_attention("sdpa (torch scaled_dot_product_attention)")
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
    )


@functools.cache
def hf_sdpa_name() -> str:
    """The name shardcore's SDPA runs under: ``shardcore_sdpa``, registered (with SDPA's mask builder) on first
    call; ``sdpa`` (transformers' own) where transformers has no mask registry (4.x before ``masking_utils``)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    except ImportError:  # transformers without a mask registry: its own SDPA function
        return "sdpa"
    AttentionInterface.register(HF_SDPA, hf_sdpa_attention)
    AttentionMaskInterface.register(HF_SDPA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return HF_SDPA


def hf_attention_switchable(model) -> bool:
    """Whether a HuggingFace model (instance or class) can change its attention at run time:
    ``set_attn_implementation`` (transformers 5), or 4.x models reading the registry per call."""
    return hasattr(model, "set_attn_implementation") or bool(getattr(model, "_supports_attention_backend", False))


def use_hf_attention(model: torch.nn.Module, backend: str) -> str:
    """Switch a HuggingFace model's attention to ``backend`` through its registry
    (``set_attn_implementation``); the registry name now in use. Raises ``NotImplementedError``
    naming the model when it cannot switch at run time."""
    name = "flash_attention_2" if backend == "flash_attention_2" else hf_sdpa_name()
    setter = getattr(model, "set_attn_implementation", None)
    fix = f"build it with attn_implementation={backend!r} instead of enable_flash_attention=True"
    configs = [m.config for m in model.modules() if getattr(m, "config", None) is not None]
    if setter is None and hf_attention_switchable(model):
        for config in configs:  # transformers 4.x: a model reading the registry at run time follows its config
            config._attn_implementation = name
    elif setter is None:
        raise NotImplementedError(
            f"enable_flash_attention: {type(model).__name__} cannot switch its attention implementation after it "
            f"was built with this transformers version (no set_attn_implementation); {fix}"
        )
    else:
        try:
            setter(name)
        except (ValueError, ImportError) as err:
            raise NotImplementedError(
                f"enable_flash_attention: {type(model).__name__} refuses {name!r}: {err}; {fix}"
            ) from err
    if any(getattr(c, "_attn_implementation", name) != name for c in configs):
        raise NotImplementedError(
            f"enable_flash_attention: {type(model).__name__} does not switch its attention implementation at run "
            f"time; {fix}"
        )
    return name


def ulysses_problem(model: torch.nn.Module, mode: str = "all_to_all", routed: bool = False) -> str | None:
    """Why :func:`use_ulysses_attention` cannot switch ``model`` to ``mode`` (``None``: it can). No collective.
    ``routed``: the policy vouches that the attention reads the registry at each call, whatever
    ``_supports_attention_backend`` says."""
    base_name = getattr(getattr(model, "config", None), "_attn_implementation", None)
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError:
        return (
            f"sequence_parallelism_mode={mode!r} runs attention through transformers' attention and mask "
            "registries, which this transformers version lacks"
        )
    if not routed and not getattr(model, "_supports_attention_backend", False):
        return (
            f"sequence_parallelism_mode={mode!r}: {type(model).__name__} does not run its attention through "
            "transformers' attention registry in this transformers version"
        )
    if base_name == "eager" and _own_eager(model) is None:
        return (
            f"sequence_parallelism_mode={mode!r}: {type(model).__name__} runs attention 'eager' and its modeling "
            "module defines no eager_attention_forward to run under the split"
        )
    known = base_name in ALL_ATTENTION_FUNCTIONS or base_name == "eager"
    if not known or base_name not in ALL_MASK_ATTENTION_FUNCTIONS:
        return (
            f"sequence_parallelism_mode={mode!r}: {type(model).__name__} runs attention {base_name!r}, which is "
            "not in transformers' attention registry; build it with attn_implementation='sdpa'"
        )
    return None


def _own_eager(model: torch.nn.Module):
    """The model's own eager attention: transformers keeps it out of its registry, each modeling module
    defining its ``eager_attention_forward``; looked up at each call in the module of the attention
    module calling (``None``: the model's modeling module defines none)."""
    fallback = getattr(sys.modules.get(type(model).__module__), "eager_attention_forward", None)
    if fallback is None:
        return None

    def eager(module, *args, **kwargs):
        calling = type(getattr(module, "_shardcore_of", module))  # Ulysses' view of its heads: the module's own
        own = getattr(sys.modules.get(calling.__module__), "eager_attention_forward", fallback)
        return own(module, *args, **kwargs)

    return eager


#: calls that may take the attention mask in an attention module's forward: the attention function, type checks
_MASK_PASSED_TO = frozenset({"attention_interface", "eager_attention_forward", "isinstance", "to"})


def mask_readers(model: torch.nn.Module) -> list[tuple[str, str, int]]:
    """``(attention class, what, line of its forward)`` for each use of the attention mask in the
    forward of an attention module of ``model`` (a class whose forward calls transformers' attention
    registry) other than handing it to the attention function: a call taking it (a sparse-attention
    indexer, a dynamic mask builder), a method of it, or arithmetic with it. Under a sequence split the
    mask covers the whole sequence while the module holds a rank's part of the queries. Read from the
    source, no forward run; a class whose source cannot be read is not listed."""
    return [use for cls in dict.fromkeys(type(m) for m in model.modules()) for use in _mask_uses(cls)]


def bias_passers(model: torch.nn.Module) -> list[tuple[str, str]]:
    """``(attention class, keyword)`` for each ``...bias...`` keyword an attention module hands the attention
    function (Inkling's relative ``position_bias``, over a rank's queries and every head)."""
    return [use for cls in dict.fromkeys(type(m) for m in model.modules()) for use in _bias_passed(cls)]


@functools.cache
def _bias_passed(cls: type) -> tuple[tuple[str, str], ...]:
    source = _registry_forward(cls)
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)] if source else []
    named = (k.arg for c in calls if getattr(c.func, "id", "") == "attention_interface" for k in c.keywords)
    return tuple((cls.__name__, k) for k in dict.fromkeys(named) if k and "bias" in k)


def reads_registry(cls: type) -> bool:
    """Whether ``cls``'s own forward calls transformers' attention registry (what a sequence split switches)."""
    return _registry_forward(cls) is not None


def _registry_forward(cls: type) -> str | None:
    """The source of ``cls``'s own forward (dedented) where it calls transformers' attention registry (an
    attention module), else ``None`` (no forward of its own, none readable, or no registry call)."""
    forward = cls.__dict__.get("forward")
    try:
        source = textwrap.dedent(inspect.getsource(forward)) if forward is not None else ""
    except (OSError, TypeError):
        return None
    return source if "ALL_ATTENTION_FUNCTIONS" in source else None


@functools.cache
def _mask_uses(cls: type) -> tuple[tuple[str, str, int], ...]:
    source = _registry_forward(cls)
    if source is None:
        return ()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            what = getattr(node.func, "id", getattr(node.func, "attr", ""))
            taken = [*node.args, *(k.value for k in node.keywords)]
            on_mask = isinstance(node.func, ast.Attribute) and _names_mask(node.func.value)
            if what not in _MASK_PASSED_TO and (on_mask or any(map(_names_mask, taken))):
                found.append((cls.__name__, f"{what}()", node.lineno))
        elif isinstance(node, ast.BinOp) and (_names_mask(node.left) or _names_mask(node.right)):
            found.append((cls.__name__, type(node.op).__name__, node.lineno))
    return tuple(found)


#: what an attention module's forward takes that a sequence split hands it as it should: the hidden states
#: (split), the rotary embeddings (split with them), the mask and the cache (the attention function's)
_SPLIT_KNOWS = {"self", "hidden_states", "position_embeddings", "attention_mask", "kwargs", "output_attentions"}
_SPLIT_KNOWS |= {"cache", "past_key_values", "past_key_value", "layer_past", "cache_position", "use_cache"}


def tensor_inputs(model: torch.nn.Module) -> list[tuple[str, str]]:
    """``(attention class, parameter)`` for each tensor an attention module of ``model`` (its forward calls
    the registry) takes besides what the split knows: one along the sequence (Ministral 3's
    ``position_ids``, Beam's ``attention_scaling``: per-position query scales) that the split cuts with the
    hidden states. Read from the signature (a parameter annotated as a tensor), no forward run."""
    return [use for cls in dict.fromkeys(type(m) for m in model.modules()) for use in _tensor_inputs(cls)]


@functools.cache
def _tensor_inputs(cls: type) -> tuple[tuple[str, str], ...]:
    if _registry_forward(cls) is None:
        return ()
    try:
        params = inspect.signature(cls.__dict__["forward"]).parameters
    except (TypeError, ValueError):
        return ()
    return tuple(
        (cls.__name__, name)
        for name, param in params.items()
        if name not in _SPLIT_KNOWS and "Tensor" in str(param.annotation)
    )


def _names_mask(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "attention_mask" for n in ast.walk(node))


def use_ulysses_attention(model: torch.nn.Module, mode: str = "all_to_all", routed: bool = False) -> str:
    """Register ``shardcore_ulysses_<implementation>`` (the model's attention implementation under
    :func:`shardcore.sequence.ulysses_attention`, with that implementation's mask builder) in
    HuggingFace's registries and switch the model to it; the name."""
    from ...sequence import ring_attention, ulysses_attention

    problem = ulysses_problem(model, mode, routed)
    if problem:
        raise NotImplementedError(problem)
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    base_name = model.config._attn_implementation
    base = _own_eager(model) if base_name == "eager" else ALL_ATTENTION_FUNCTIONS[base_name]
    if mode == "all_to_all":
        wrapped, name = ulysses_attention(base), f"shardcore_ulysses_{base_name}"
    else:  # ring_attn, all_gather_kv
        wrapped, name = ring_attention(base, gather=mode == "all_gather_kv"), f"shardcore_{mode}_{base_name}"
    AttentionInterface.register(name, wrapped)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base_name])
    setter = getattr(model, "set_attn_implementation", None)
    if setter is not None:
        setter(name)
    else:  # transformers 4.x reads the config per call
        for module in model.modules():
            if getattr(module, "config", None) is not None:
                module.config._attn_implementation = name
    return name


class _Registry:
    """The core's view of this registry (see :func:`shardcore.kernels.register_attention_registry`)."""

    unpadded = staticmethod(unpadded_masks)
    switchable = staticmethod(hf_attention_switchable)
    use = staticmethod(use_hf_attention)
    sequence_problem = staticmethod(ulysses_problem)
    use_sequence = staticmethod(use_ulysses_attention)
    module = sys.modules[__name__]


#: HuggingFace's registry, as the core asks for it
REGISTRY = _Registry()
register_attention_registry(REGISTRY)
