"""Kernel choices behind ``ShardConfig``'s optimization switches (attention backend, fused
normalization, JIT-fused elementwise ops), decided per device and dtype, with clean fallbacks.

Nothing here imports a model library at import time; the HuggingFace attention registry is
touched only when a HuggingFace model asks for it (:func:`use_hf_attention`).
"""

from __future__ import annotations

import functools
import importlib.util
import logging

import torch

__all__ = ["FLASH_DTYPES", "attention_backend", "flash_attn_available"]

log = logging.getLogger("shardcore")

#: dtypes flash-attn 2 computes in.
FLASH_DTYPES = (torch.float16, torch.bfloat16)


@functools.cache
def flash_attn_available() -> bool:
    """Whether the ``flash_attn`` package (2.x) is importable (``pip install shardcore[flash]``)."""
    if importlib.util.find_spec("flash_attn") is None:
        return False
    try:
        from importlib.metadata import version

        return int(version("flash-attn").split(".")[0]) >= 2
    except Exception:  # metadata missing or unparsable: the import is what counts
        return True


def attention_backend(device: torch.device | str, dtype: torch.dtype, *, flash: bool | None = None) -> str:
    """The attention backend ``enable_flash_attention=True`` runs for tensors on ``device`` in ``dtype``.

    ``"flash_attention_2"`` when ``flash_attn`` is installed (``flash``: override the probe) and
    the tensors are CUDA fp16/bf16; otherwise ``"sdpa"``
    (``torch.nn.functional.scaled_dot_product_attention``, fused kernels on CPU and CUDA).
    """
    device = torch.device(device)
    flash = flash_attn_available() if flash is None else flash
    if flash and device.type == "cuda" and dtype in FLASH_DTYPES:
        return "flash_attention_2"
    return "sdpa"


def _first_param(model: torch.nn.Module) -> torch.Tensor | None:
    return next((p for p in model.parameters() if p.is_floating_point()), None)


def run_device(model: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    """Where and in what dtype ``model`` will run: its parameters' device and dtype; a model still
    on ``meta`` (lazy loading) will run on CUDA if there is one, else on the CPU."""
    p = _first_param(model)
    if p is None:
        return torch.device("cpu"), torch.get_default_dtype()
    device = p.device
    if device.type == "meta":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return device, p.dtype


# --- HuggingFace's attention registry ---------------------------------------------------------

#: The name shardcore's SDPA function is registered under in transformers' attention registries.
HF_SDPA = "shardcore_sdpa"
_announced: set[str] = set()


def _announce(what: str) -> None:
    if what not in _announced:
        _announced.add(what)
        log.info("shardcore attention backend running: %s", what)


def hf_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA attention, except that grouped-query attention with a mask on the CPU
    runs ``scaled_dot_product_attention(..., enable_gqa=True)`` on the un-repeated K/V (transformers
    materializes ``num_key_value_groups`` copies of them there). Everything else (no mask, no
    groups, position bias, paged caches) is transformers' own function."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plain = all(kwargs.get(k) is None for k in ("position_bias", "softcap", "s_aux", "sinks", "cache"))
    if plain and attention_mask is not None and query.device.type == "cpu" and query.shape[1] != key.shape[1]:
        _announce("sdpa (torch scaled_dot_product_attention, grouped K/V not repeated)")
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
        )
        return out.transpose(1, 2).contiguous(), None
    _announce("sdpa (torch scaled_dot_product_attention)")
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
    )


@functools.cache
def hf_sdpa_name() -> str:
    """The name shardcore's SDPA runs under in this transformers: ``shardcore_sdpa``, registered
    (with SDPA's mask builder) on first call; ``sdpa`` (transformers' own) where transformers has
    no mask registry (4.x before ``masking_utils``)."""
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


def ulysses_problem(model: torch.nn.Module, mode: str = "all_to_all") -> str | None:
    """Why :func:`use_ulysses_attention` cannot switch ``model`` to ``mode`` (``None``: it can). No collective."""
    base_name = getattr(getattr(model, "config", None), "_attn_implementation", None)
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError:
        return (
            f"sequence_parallelism_mode={mode!r} runs attention through transformers' attention and mask "
            "registries, which this transformers version lacks"
        )
    if not getattr(model, "_supports_attention_backend", False):
        return (
            f"sequence_parallelism_mode={mode!r}: {type(model).__name__} does not run its attention through "
            "transformers' attention registry in this transformers version"
        )
    if base_name not in ALL_ATTENTION_FUNCTIONS or base_name not in ALL_MASK_ATTENTION_FUNCTIONS:
        return (
            f"sequence_parallelism_mode={mode!r}: {type(model).__name__} runs attention {base_name!r}, which is "
            "not in transformers' attention registry; build it with attn_implementation='sdpa'"
        )
    return None


def use_ulysses_attention(model: torch.nn.Module, mode: str = "all_to_all") -> str:
    """Register ``shardcore_ulysses_<implementation>`` (the model's attention implementation under
    :func:`shardcore.sequence.ulysses_attention`, with that implementation's mask builder) in
    HuggingFace's registries and switch the model to it; the name."""
    from .sequence import ring_attention, ulysses_attention

    problem = ulysses_problem(model, mode)
    if problem:
        raise NotImplementedError(problem)
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    base_name = model.config._attn_implementation
    base = ALL_ATTENTION_FUNCTIONS[base_name]
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


# --- applying the switches ------------------------------------------------------------------------


def _switches(config) -> tuple[bool, bool, bool]:
    every = config.enable_all_optimization
    return (
        every or config.enable_flash_attention,
        every or config.enable_fused_normalization,
        every or config.enable_jit_fused,
    )


def replace_norms(model: torch.nn.Module, classes: tuple[type, ...]) -> int:
    """Put every ``nn.LayerNorm`` / ``nn.RMSNorm`` (exactly those classes) and every instance of
    ``classes`` (the policy's, see :meth:`shardcore.Policy.norm_classes`) on its fused layer,
    keeping the parameters; how many were replaced."""
    from .tensor_parallel.norm import FusedLayerNorm, FusedRMSNorm

    targets = []
    for name, module in model.named_modules():
        if type(module) is torch.nn.LayerNorm or (
            isinstance(module, classes) and isinstance(module, torch.nn.LayerNorm)
        ):
            targets.append((name, FusedLayerNorm))
        elif isinstance(module, classes) or type(module) is getattr(torch.nn, "RMSNorm", None):
            targets.append((name, FusedRMSNorm))
    for name, cls in targets:
        parent, _, attr = name.rpartition(".")
        holder = model.get_submodule(parent) if parent else model
        setattr(holder, attr, cls.from_native_module(getattr(holder, attr)))
    return len(targets)


@functools.cache
def compile_available() -> str | None:
    """``None`` when ``torch.compile`` works here (probed once on a tiny function), else the reason."""
    try:
        fn = torch.compile(lambda x: torch.nn.functional.gelu(x + 1.0), dynamic=True)
        fn(torch.ones(8))
    except Exception as err:  # no C++ compiler, unsupported Python, broken inductor...
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return None


def compile_modules(modules: list[tuple[str, torch.nn.Module]]) -> str:
    """Compile each module's ``forward`` with ``torch.compile`` (shapes dynamic, so new batch or
    sequence sizes do not recompile; the tensor-parallel collectives inside are graph ops, see
    :mod:`shardcore.distributed.traced`), or, where compilation is unavailable, leave them eager and
    say so once at WARNING."""
    if not modules:
        return "nothing to fuse in this model"
    reason = compile_available()
    if reason is not None:
        if "jit" not in _announced:
            _announced.add("jit")
            log.warning("enable_jit_fused: torch.compile is unavailable here (%s); running unfused", reason)
        return f"unfused (torch.compile unavailable: {reason})"
    for _, module in modules:
        module.forward = torch.compile(module.forward, dynamic=True)
    kinds = sorted({type(m).__name__ for _, m in modules})
    return f"{len(modules)} modules compiled ({', '.join(kinds)})"


def apply(model: torch.nn.Module, policy, config) -> dict[str, str]:
    """Apply ``config``'s attention and normalization switches to ``model`` through ``policy``
    (before sharding and before any collective: a refusal is raised on every rank alike); what each runs."""
    flash, norms, _ = _switches(config)
    done: dict[str, str] = {}
    name = type(model).__name__
    if flash:
        device, dtype = run_device(model)
        backend = attention_backend(device, dtype)
        done["attention"] = policy.set_attention_backend(backend)
        log.info("enable_flash_attention: %s attention on %s (%s, %s)", name, done["attention"], device.type, dtype)
    if norms:
        count = replace_norms(model, tuple(policy.norm_classes()))
        done["normalization"] = f"{count} norms on fused kernels"
        log.info("enable_fused_normalization: %s: %s", name, done["normalization"])
    return done


def apply_jit(model: torch.nn.Module, policy, config, done: dict[str, str]) -> dict[str, str]:
    """Apply ``enable_jit_fused`` to the (sharded) model: compile the policy's fusible modules."""
    if _switches(config)[2]:
        done["jit_fused"] = compile_modules(policy.fusible_modules())
        log.info("enable_jit_fused: %s: %s", type(model).__name__, done["jit_fused"])
    return done
