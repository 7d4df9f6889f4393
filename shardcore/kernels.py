"""Kernel choices behind ``ShardConfig``'s optimization switches (attention backend, fused
normalization, JIT-fused elementwise ops), decided per device and dtype, with clean fallbacks.

Nothing here knows a model library: switching a model's attention goes through the registry its
library's integration registers (:func:`attention_registry`; HuggingFace's lives in
:mod:`shardcore.integrations.hf.attention`).
"""

from __future__ import annotations

import functools
import importlib.util
import logging

import torch

from .moved import moved_names

__all__ = ["FLASH_DTYPES", "attention_backend", "flash_attn_available"]

from .spec.attention import attention_registry, register_attention_registry  # noqa: F401 - kernels' names

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


# --- the model library's attention registry ---------------------------------------------------

_announced: set[str] = set()


def announce_attention(what: str) -> None:
    """Log once, at INFO, which attention implementation runs (the first call for each ``what``)."""
    if what not in _announced:
        _announced.add(what)
        log.info("shardcore attention backend running: %s", what)


# the slot itself lives below the parallelisms (sequence parallelism switches attention through it too)


#: Moved to :mod:`shardcore.integrations.hf.attention` (0.2): the old names still work, warned.
_MOVED = (
    "HF_SDPA",
    "hf_attention_switchable",
    "hf_sdpa_attention",
    "hf_sdpa_name",
    "ulysses_problem",
    "use_hf_attention",
    "use_ulysses_attention",
)


__getattr__ = moved_names(__name__, "shardcore.integrations.hf.attention", _MOVED)


# --- applying the switches ------------------------------------------------------------------------


def _switches(config) -> tuple[bool, bool, bool]:
    every = config.enable_all_optimization
    return (
        every or config.enable_flash_attention,
        every or config.enable_fused_normalization,
        every or config.enable_jit_fused,
    )


def norm_targets(model: torch.nn.Module, classes: tuple[type, ...]) -> list[tuple[str, type]]:
    """``(name, fused class)`` of every norm :func:`replace_norms` puts on a fused layer."""
    from .tensor_parallel.norm import FusedLayerNorm, FusedRMSNorm

    targets = []
    for name, module in model.named_modules():
        if type(module) is torch.nn.LayerNorm or (
            isinstance(module, classes) and isinstance(module, torch.nn.LayerNorm)
        ):
            targets.append((name, FusedLayerNorm))
        elif isinstance(module, classes) or type(module) is getattr(torch.nn, "RMSNorm", None):
            targets.append((name, FusedRMSNorm))
    return targets


def replace_norms(model: torch.nn.Module, classes: tuple[type, ...]) -> int:
    """Put every ``nn.LayerNorm`` / ``nn.RMSNorm`` (exactly those classes) and every instance of
    ``classes`` (the policy's, see :attr:`KernelSpec.norm_classes <shardcore.spec.KernelSpec>`) on its fused layer,
    keeping the parameters; how many were replaced."""
    targets = norm_targets(model, classes)
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
        use = policy.kernels().attention_backend
        done["attention"] = use(backend) if use is not None else attention_registry().use(model, backend)
        log.info("enable_flash_attention: %s attention on %s (%s, %s)", name, done["attention"], device.type, dtype)
    if norms:
        count = replace_norms(model, policy.kernels().norm_classes)
        done["normalization"] = f"{count} norms on fused kernels"
        log.info("enable_fused_normalization: %s: %s", name, done["normalization"])
    return done


def apply_jit(model: torch.nn.Module, policy, config, done: dict[str, str]) -> dict[str, str]:
    """Apply ``enable_jit_fused`` to the (sharded) model: compile the policy's fusible modules."""
    if _switches(config)[2]:
        done["jit_fused"] = compile_modules(list(policy.kernels().fusible))
        log.info("enable_jit_fused: %s: %s", type(model).__name__, done["jit_fused"])
    return done
