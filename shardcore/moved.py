"""The 0.x layer, whole: what a plugin written against 0.1 still reaches works here, each use warned with a
``DeprecationWarning`` naming the new spelling and the release it goes away in (:data:`UNTIL`); nothing else in
the core knows a 0.x spelling, and at 0.3 this module goes, with the changelog saying so. Names that left a
module (:func:`moved_names`, :func:`renamed`), module paths that are gone (:data:`OLD_PATHS`, served by a finder
on ``sys.meta_path``), a policy's 0.x members and helpers (:data:`POLICY_MEMBERS`, :data:`POLICY_HELPERS`), 0.x's
hook base classes (:class:`PipelineHooks`, :class:`SequenceHooks`) and an ``HFStages`` policy's 0.1 class
attributes (:data:`STAGE_ATTRIBUTES`). A new home is imported by name when read (it may sit above this module)."""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable, Iterable

__all__ = [
    "OLD_PATHS",
    "POLICY_HELPERS",
    "POLICY_MEMBERS",
    "STAGE_ATTRIBUTES",
    "UNTIL",
    "PipelineHooks",
    "SequenceHooks",
    "hook_class",
    "legacy_spec",
    "moved_names",
    "policy_member",
    "renamed",
    "stage_facts_of",
    "warn_legacy",
    "warn_stage_attributes",
]

#: the release the 0.x spellings go away in
UNTIL = "0.3"


def _warn(message: str, stacklevel: int = 3) -> None:
    warnings.warn(f"{message} (the old spelling goes away in {UNTIL})", DeprecationWarning, stacklevel=stacklevel)


def moved_names(old: str, new: str, names: Iterable[str], *, until: str = UNTIL) -> Callable[[str], object]:
    """The ``__getattr__`` of module ``old`` for ``names``, which moved to module ``new``; any other
    missing name raises the usual ``AttributeError``."""
    names = frozenset(names)

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(
            f"{old}.{name} moved to {new}.{name}: import it from there (the old name goes away in {until})",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new), name)

    return __getattr__


def renamed(module: str, names: dict[str, str], *, hint: str = "", until: str = UNTIL) -> Callable[[str], object]:
    """The ``__getattr__`` of ``module`` for its own names that were renamed (``{old: new}``): reading an
    old one warns naming the new and returns it."""

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new = names[name]
        told = f"{module}.{name} is {module}.{new} now" + (f": {hint}" if hint else "")
        warnings.warn(f"{told} (the old name goes away in {until})", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(module), new)

    return __getattr__


# ---- module paths that are gone
#: 0.x module path -> the module(s) its names are in now (several: one module joining them)
OLD_PATHS: dict[str, tuple[str, ...]] = {
    "shardcore.layers": ("shardcore.tensor_parallel",),
    **{
        f"shardcore.layers.{name}": (f"shardcore.tensor_parallel.{name}",)
        for name in ("linear", "conv1d", "embedding", "loss", "norm", "parallel_module", "rng", "shard_spec")
    },
    "shardcore.layers.comm": ("shardcore.tensor_parallel.mappings", "shardcore.tensor_parallel.regions"),
    "shardcore.pipeline.hooks": ("shardcore.moved",),
    "shardcore.sequence.hooks": ("shardcore.moved",),
}


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves :data:`OLD_PATHS` as modules reading through to the new ones, warning once per path."""

    def find_spec(self, name, path=None, target=None):
        known = name in OLD_PATHS
        return importlib.util.spec_from_loader(name, self, is_package=name == "shardcore.layers") if known else None

    def create_module(self, spec):
        news = [importlib.import_module(n) for n in OLD_PATHS[spec.name]]
        module = types.ModuleType(spec.name, f"0.x's {spec.name}: now {', '.join(m.__name__ for m in news)}")

        def __getattr__(name: str):  # (a dunder is the proxy's own: its __path__ must not be the new package's)
            for new in news if not name.startswith("__") else ():
                if hasattr(new, name):
                    return getattr(new, name)
            raise AttributeError(f"module {spec.name!r} has no attribute {name!r}")

        module.__getattr__ = __getattr__
        module.__all__ = [n for new in news for n in getattr(new, "__all__", ())]
        _warn(f"{spec.name} is deprecated: import from {' and '.join(m.__name__ for m in news)} instead")
        return module

    def exec_module(self, module) -> None:
        pass


if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
    sys.meta_path.append(_OldPaths())


# ---- a policy's 0.x members and helpers
#: ``{0.x member: (policy method, spec field, how it is read)}``; ``"call"``: a method called with no
#: argument, ``"value"``: an attribute (or property), ``"bound"``: a method handed over as the field's callable
POLICY_MEMBERS: dict[str, tuple[str, str, str]] = {
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

#: 0.x's helper methods of a policy: ``{name: f(plugin_api, policy) -> what the old attribute gave}``
POLICY_HELPERS: dict[str, Callable] = {
    "blocks_in": lambda api, p: lambda *c: api.blocks_in(p.model, *c),
    "in_blocks": lambda api, p: lambda *s: api.in_blocks(p.blocks(), *s),
    "block_type": lambda api, p: lambda: api.block_type(p.blocks(), p.model),
    "block_types": lambda api, p: lambda: list(dict.fromkeys(type(m) for _, m in p.blocks())),
    "require_divisible": lambda api, p: api.require_divisible,
    "require_kv_heads": lambda api, p: api.require_kv_heads,
}


@functools.cache
def _legacy_members(cls: type) -> tuple[str, ...]:
    """The 0.x members ``cls`` defines, or inherits from a class outside shardcore (once per class)."""
    outside = [k for k in cls.__mro__ if not k.__module__.startswith("shardcore.")]
    return tuple(n for n in POLICY_MEMBERS if any(n in vars(k) for k in outside))


def warn_legacy(cls: type) -> None:
    """Warn once per class defining 0.x members, naming each one's new spelling."""
    mine = [n for n in POLICY_MEMBERS if n in vars(cls)]
    if mine:
        spelled = "; ".join(f"{n} -> {POLICY_MEMBERS[n][0]}().{POLICY_MEMBERS[n][1]}" for n in mine)
        told = f"{cls.__module__}.{cls.__qualname__} declares 0.x policy members ({spelled})"
        _warn(f"{told}: return a shardcore.plugin_api spec from the policy method instead", stacklevel=4)


def legacy_spec(policy, method: str):
    """The spec ``method`` of ``policy`` built from its 0.x members; ``None`` when it declares none."""
    names = [n for n in _legacy_members(type(policy)) if POLICY_MEMBERS[n][0] == method]
    if not names:
        return None
    import attrs

    from .spec.kinds import SPECS

    fields = {}
    for name in names:
        try:
            member = getattr(policy, name)
            fields[POLICY_MEMBERS[name][1]] = member() if POLICY_MEMBERS[name][2] == "call" else member
        except NotImplementedError:
            continue  # a 0.x hook the policy left to its base: not declared
    if method == "pipeline":
        needed = [f.name for f in attrs.fields(SPECS["pipeline"]) if f.default is attrs.NOTHING]
        if any(n not in fields for n in needed):
            return None  # a pipeline needs every one of them: 0.x refused it then too
    return SPECS[method](**fields)


def policy_member(policy, name: str):
    """``Policy.__getattr__``: a 0.x member or helper read through its new spelling, warned."""
    if name in POLICY_HELPERS:
        _warn(f"Policy.{name} is 0.x's spelling: use shardcore.plugin_api.{name.removesuffix('s')}", stacklevel=4)
        return POLICY_HELPERS[name](importlib.import_module("shardcore.plugin_api"), policy)
    if name in POLICY_MEMBERS:
        method, field, kind = POLICY_MEMBERS[name]
        _warn(f"Policy.{name} is 0.x's spelling: use Policy.{method}().{field}", stacklevel=4)
        spec = getattr(policy, method)()
        if spec is None:
            raise NotImplementedError(f"{type(policy).__name__} declares no {method} (Policy.{method}() is None)")
        value = getattr(spec, field)
        return (lambda *a, **k: value) if kind == "call" else value
    raise AttributeError(f"{type(policy).__name__!r} object has no attribute {name!r}")


# ---- 0.x's hook base classes (shardcore.plugin_api.PipelineHooks / SequenceHooks)
def _unimplemented(name: str) -> Callable:
    def hook(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not implement {name}()")

    return hook


class PipelineHooks:
    """0.x's pipeline members of a policy, now :class:`~shardcore.spec.PipelineSpec` fields (:data:`POLICY_MEMBERS`)."""

    pipeline_block_returns_tuple: bool | tuple[int, ...] | None = None
    pipeline_generate_unsupported: str | None = None

    def pipeline_zero_ends(self) -> tuple[str, ...]:
        return ()


for _name in ("ends", "inputs", "stage_forward", "output", "num_items", "loss"):
    setattr(PipelineHooks, f"pipeline_{_name}", _unimplemented(f"pipeline_{_name}"))


class SequenceHooks:
    """0.x's sequence-parallel members of a policy, now :class:`~shardcore.spec.SequenceSpec` fields."""

    sequence_parallelism_modes: tuple[str, ...] = ()
    sequence_parallel_dropouts: tuple[str, ...] = ()
    sequence_split_kwargs: tuple[str, ...] = ()
    sequence_parallel_heads = _unimplemented("sequence_parallel_heads")


def hook_class(name: str) -> type:
    """``shardcore.plugin_api.PipelineHooks`` / ``SequenceHooks``, warned."""
    spec, method = {"PipelineHooks": ("PipelineSpec", "pipeline"), "SequenceHooks": ("SequenceSpec", "sequence")}[name]
    _warn(
        f"shardcore.plugin_api.{name} is 0.x's spelling: return a shardcore.plugin_api.{spec} from the policy's {method}() instead"
    )
    return {"PipelineHooks": PipelineHooks, "SequenceHooks": SequenceHooks}[name]


# ---- an HFStages policy's 0.1 class attributes
#: 0.1's class attributes of an ``HFStages`` policy -> the :class:`~shardcore.plugin_api.StageFacts` field each is now
STAGE_ATTRIBUTES = {name: name for name in ("first_ends", "last_ends", "zero_ends", "heads")} | {
    f"stage_{name}": name
    for name in (
        "inputs",
        "first_inputs",
        "call",
        "ignored",
        "loss",
        "output",
        "block_returns_tuple",
        "generate_refusal",
    )
}


def warn_stage_attributes(cls: type) -> None:
    """Warn when ``cls`` (an ``HFStages`` policy) declares 0.1's stage attributes, naming the value that says it now."""
    old = [name for name in STAGE_ATTRIBUTES if name in vars(cls)]
    if old and "stages" not in vars(cls):
        fields = ", ".join(f"{STAGE_ATTRIBUTES[name]}=..." for name in old)
        _warn(
            f"{cls.__qualname__} declares 0.1's HFStages attributes {old}: return "
            f"shardcore.plugin_api.StageFacts({fields}) from its stages() instead",
            stacklevel=4,
        )


def stage_facts_of(policy) -> object:
    """The ``StageFacts`` of a policy that does not override ``stages()``: the defaults, with any of 0.1's
    attributes its class declares (:data:`STAGE_ATTRIBUTES`, a property read on the policy) read into it."""
    facts = importlib.import_module("shardcore.integrations.hf.stages").StageFacts
    declared = {new: getattr(policy, old) for old, new in STAGE_ATTRIBUTES.items() if hasattr(type(policy), old)}
    return facts(**declared)
