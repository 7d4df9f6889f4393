"""What a family supports, read off its policy: ``shardcore plugins --features`` and ``nox -s matrix``.

A feature is a layout (:data:`FEATURES`: the ``ShardConfig`` fields and the world it runs on). A
family *declares* it when ``optimize``'s own checks accept that layout for its model on paper
(:func:`~shardcore.explain.check_on_paper`: the policy's specs, nothing allocated, no process): the
same checks a user's ``optimize`` meets, so what is declared is what ``optimize`` will try, and a
refusal is ``optimize``'s message. The kernel switches run wherever they are asked; a family
declares them where they act: a norm to fuse (``nn.LayerNorm``, ``nn.RMSNorm``, or a class its
:class:`~shardcore.spec.KernelSpec` names), modules to compile (``KernelSpec.fusible``). ``nox -s matrix`` then measures every declared cell against the unsharded
model, and a test fails where a declaration and a measurement disagree.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..config import ShardConfig

__all__ = ["FEATURES", "declared", "family_features"]

_SP = {"enable_sequence_parallelism": True}
#: feature -> (ShardConfig fields, ranks): the cells of the table (2 ranks each, FSDP x TP on 4)
FEATURES: dict[str, tuple[dict[str, Any], int]] = {
    "tp": ({"tensor_parallel_size": 2}, 2),
    "sp_split_gather": ({"tensor_parallel_size": 2, **_SP, "sequence_parallelism_mode": "split_gather"}, 2),
    "sp_overlap": (
        {
            "tensor_parallel_size": 2,
            **_SP,
            "sequence_parallelism_mode": "split_gather",
            "enable_sequence_overlap": True,
        },
        2,
    ),
    "sp_ulysses": ({"sequence_parallel_size": 2, **_SP, "sequence_parallelism_mode": "all_to_all"}, 2),
    "sp_ring": ({"sequence_parallel_size": 2, **_SP, "sequence_parallelism_mode": "ring_attn"}, 2),
    "pp": ({"pipeline_parallel_size": 2, "num_microbatches": 2}, 2),
    "fsdp": ({"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel": "fsdp"}, 4),
    "fused_norm": ({"tensor_parallel_size": 2, "enable_fused_normalization": True}, 2),
    "jit_fused": ({"tensor_parallel_size": 2, "enable_jit_fused": True}, 2),
    "lazy_init": ({"tensor_parallel_size": 2}, 2),
}


def declared(model: nn.Module, features: dict | None = None) -> dict[str, str | None]:
    """``{feature: None (declared) or the refusal}`` for ``model`` (built on the meta device; left as it is)."""
    from . import ExplainError, check_on_paper

    out: dict[str, str | None] = {}
    for name, (fields, _) in (features or FEATURES).items():
        config = ShardConfig(**fields)
        dims = {
            "pp": config.pipeline_parallel_size,
            "sp": config.sequence_parallel_size,
            "dp": config.data_parallel_size or 1,
        }
        try:
            check_on_paper(model, config.tensor_parallel_size or 1, config=config, **dims)
        except (ExplainError, NotImplementedError, ValueError) as err:
            out[name] = str(err).splitlines()[0]
            continue
        out[name] = _kernel_refusal(model, name)
    return out


def _kernel_refusal(model: nn.Module, feature: str) -> str | None:
    """Why the policy's :class:`~shardcore.spec.KernelSpec` gives ``feature`` nothing to act on (``None``: it does)."""
    if feature not in ("fused_norm", "jit_fused"):
        return None
    from ..distributed import ParallelLayout
    from ..distributed.collectives import PaperGroup
    from ..kernels import norm_targets
    from ..steps import Build, run_steps

    config = ShardConfig(tensor_parallel_size=2)
    build = Build(model, config, None, layout=ParallelLayout.from_config(config, world_size=2), group=PaperGroup(0, 2))
    policy = run_steps(build, ("policy",)).policy
    spec = policy.kernels()
    if feature == "fused_norm" and not norm_targets(model, tuple(spec.norm_classes)):
        return (
            f"no norm to fuse: {type(model).__name__} has no nn.LayerNorm / nn.RMSNorm and "
            f"{type(policy).__name__}.kernels() names no norm class (KernelSpec.norm_classes)"
        )
    if feature == "jit_fused" and not spec.fusible:
        return f"{type(policy).__name__}.kernels() names no modules to compile (KernelSpec.fusible)"
    return None


#: which model class stands for a plugin's family in ``shardcore plugins --features``: the first whose name ends so
_PREFERRED = ("ForCausalLM", "ForConditionalGeneration", "ForMaskedLM", "ForImageClassification", "LMHeadModel")


def family_features(registry) -> list[dict]:
    """Per installed plugin: its family's model (the class a user most likely trains, built from its
    default config on the meta device) and :func:`declared` of it, or why it could not be built."""
    rows = []
    for plugin in registry.plugins.values():
        if plugin.error or not plugin.models:
            continue
        chosen = _representative(plugin.name, sorted(plugin.models))
        row = {"plugin": plugin.name, "model": chosen.rsplit(".", 1)[-1], "features": {}, "error": None}
        try:
            row["features"] = declared(_build_default(chosen))
        except Exception as err:  # a class that cannot be built from its defaults: said, the others go on
            row["error"] = f"{row['model']} could not be built from its default config: {type(err).__name__}: {err}"
        rows.append(row)
    return rows


def _representative(plugin: str, models: list[str]) -> str:
    """The class named after the plugin's family first (``t5``: T5's, not MT5's), by :data:`_PREFERRED`."""
    own = [m for m in models if m.rsplit(".", 1)[-1].lower().startswith(plugin.lower())] or models
    return next((m for end in _PREFERRED for m in own if m.endswith(end)), own[0])


def _build_default(qualname: str) -> nn.Module:
    import importlib

    from ..meta import init_empty

    module, _, name = qualname.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    config_class = getattr(cls, "config_class", None)
    with init_empty():
        return cls(config_class()) if config_class is not None else cls()
