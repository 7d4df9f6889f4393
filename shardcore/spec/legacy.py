"""Policies written on 0.x's members: read into the specs, with a ``DeprecationWarning`` naming the new spelling.

A policy class that defines (or inherits from a class outside shardcore) one of the names below still works
for this minor version: :class:`~shardcore.Policy`'s default spec methods build the spec from them. The
warning is given once, when the class is defined.
"""

from __future__ import annotations

import warnings

import attrs

from .kinds import SPECS

#: ``{0.x member: (policy method, spec field, how it is read)}``; ``"call"``: a method called with no
#: argument, ``"value"``: an attribute (or property), ``"bound"``: a method handed over as the field's callable
MOVED: dict[str, tuple[str, str, str]] = {
    "supports_parallel_output": ("tensor_parallel", "parallel_output", "value"),
    "share_tp_copies": ("tensor_parallel", "share_copies", "value"),
    "grad_sum_parameters": ("tensor_parallel", "grad_sum", "value"),
    "pipeline_ends": ("pipeline", "ends", "call"),
    "pipeline_zero_ends": ("pipeline", "zero_ends", "call"),
    "pipeline_inputs": ("pipeline", "inputs", "bound"),
    "pipeline_stage_forward": ("pipeline", "stage_forward", "bound"),
    "pipeline_output": ("pipeline", "output", "bound"),
    "pipeline_num_items": ("pipeline", "num_items", "bound"),
    "pipeline_loss": ("pipeline", "loss", "bound"),
    "pipeline_block_returns_tuple": ("pipeline", "block_returns_tuple", "value"),
    "pipeline_generate_unsupported": ("pipeline", "generate_refusal", "value"),
    "sequence_parallelism_modes": ("sequence", "modes", "value"),
    "sequence_parallel_dropouts": ("sequence", "dropouts", "value"),
    "sequence_split_kwargs": ("sequence", "split_kwargs", "value"),
    "sequence_parallel_heads": ("sequence", "heads", "call"),
    "sequence_parallel_regions": ("sequence", "regions", "call"),
    "sequence_attention_problem": ("sequence", "attention_problem", "bound"),
    "set_sequence_attention": ("sequence", "set_attention", "bound"),
    "supports_expert_parallel": ("experts", "supported", "value"),
    "expert_parallel_refusal": ("experts", "refusal", "value"),
    "balance_over_global_batch": ("experts", "balance", "bound"),
    "data_parallel_shard_dims": ("data_parallel", "shard_dims", "call"),
    "norm_classes": ("kernels", "norm_classes", "call"),
    "fusible_modules": ("kernels", "fusible", "call"),
    "set_attention_backend": ("kernels", "attention_backend", "bound"),
    "checkpoint_names": ("checkpoints", "names", "bound"),
    "checkpoint_parts": ("checkpoints", "parts", "bound"),
    "materialize_buffers": ("checkpoints", "materialize", "bound"),
    "planned_blocks": ("checks", "blocks", "call"),
}


def _outside(cls: type) -> bool:
    return not cls.__module__.startswith("shardcore.")


def legacy_members(cls: type) -> list[str]:
    """The 0.x members ``cls`` defines, or inherits from a class outside shardcore."""
    return [n for n in MOVED if any(n in vars(k) for k in cls.__mro__ if _outside(k))]


def warn_legacy(cls: type) -> None:
    """Warn once per class defining 0.x members, naming each one's new spelling."""
    mine = [n for n in MOVED if n in vars(cls)]
    if mine:
        spelled = "; ".join(f"{n} -> {MOVED[n][0]}().{MOVED[n][1]}" for n in mine)
        warnings.warn(
            f"{cls.__module__}.{cls.__qualname__} declares 0.x policy members ({spelled}): return a "
            "shardcore.plugin_api spec from the policy method instead (docs/writing_a_policy.md); the old "
            "spelling is read for this minor version only",
            DeprecationWarning,
            stacklevel=3,
        )


def read(policy, name: str):
    """The value of the 0.x member ``name`` as the spec field expects it."""
    kind = MOVED[name][2]
    member = getattr(policy, name)  # legacy_members says the class has it
    return member() if kind == "call" else member


def spec(policy, method: str):
    """The spec ``method`` of ``policy`` built from its 0.x members; ``None`` when it declares none."""
    names = [n for n in legacy_members(type(policy)) if MOVED[n][0] == method]
    if not names:
        return None
    fields = {}
    for name in names:
        try:
            fields[MOVED[name][1]] = read(policy, name)
        except NotImplementedError:
            continue  # a 0.x hook the policy left to its base: not declared
    if method == "pipeline":
        needed = [f.name for f in attrs.fields(SPECS["pipeline"]) if f.default is attrs.NOTHING]
        if any(n not in fields for n in needed):
            return None  # a pipeline needs every one of them: 0.x refused it then too
    return SPECS[method](**fields)
