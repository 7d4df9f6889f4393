"""``ModelSharder`` applies a :class:`~shardcore.Policy` to a model (match -> replace -> retie), and
the checks and guards :mod:`shardcore.steps` runs around it."""

from __future__ import annotations

import types
from collections import defaultdict

import attrs
import torch
from torch import nn

from .config import ShardConfig
from .distributed import ParallelLayout
from .distributed.collectives import all_gather_cat
from .integrations.hf.peft import (
    is_lora_layer,
    shard_lora_layer,
)
from .policy import ModulePolicyDescription, Policy
from .tensor_parallel.regions import enter_tp_region
from .tensor_parallel.rng import run_in_shared_rng, run_in_tp_rng

__all__ = [
    "ModelSharder",
    "ShardInfo",
    "check_policy_features",
    "check_same_weights",
    "resolve_policy",
]


@attrs.frozen
class ShardInfo:
    """Stored on a sharded model as ``model.shardcore``.

    ``process_group`` is the tensor-parallel group the model uses: ``layout.group("tp")``, or the
    ``tensor_parallel_process_group`` the config gave (then ``layout`` only records the degrees).
    """

    config: ShardConfig
    tp_size: int
    process_group: object
    policy: Policy
    layout: ParallelLayout
    #: What each optimization switch runs (``{"attention": "shardcore_sdpa", ...}``), see :mod:`shardcore.kernels`.
    kernels: dict = attrs.field(factory=dict)
    #: What runs on the data-parallel dim: ``"fsdp"``, ``"ddp"`` or ``None`` (see :mod:`shardcore.data_parallel`).
    data_parallel: str | None = None
    #: This rank's pipeline stages and schedule (:class:`shardcore.pipeline.PipelineInfo`), or ``None``.
    pipeline: object = None
    #: The model's collectives (:class:`shardcore.distributed.collectives.Scope`): its bound, and
    #: ``scope.counts``, how many of each kind its forwards and backwards issued.
    scope: object = None
    #: What ``ShardConfig(auto=...)`` chose (:mod:`shardcore.cost.auto`): the layout's ``name``,
    #: predicted ``step_s`` and ``memory_bytes``, the ``config`` fields it set, the ``seq``,
    #: ``batch`` and ``world`` planned for, and how many ``layouts`` it ranked; ``None`` without auto.
    auto: dict | None = None
    #: What optimize attached to the model (:mod:`shardcore.attach`), in the order it runs: ``print(model.shardcore)``.
    attached: object = None

    def __str__(self) -> str:
        """Every hook and routed method shardcore put on the model, in the order they run."""
        return self.attached.describe() if self.attached is not None else "nothing attached"

    describe = __str__


def _get(module: nn.Module, dotted: str):
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def _set(module: nn.Module, dotted: str, value) -> None:
    parent, _, name = dotted.rpartition(".")
    setattr(_get(module, parent) if parent else module, name, value)


def _has(module: nn.Module, dotted: str) -> bool:
    try:
        _get(module, dotted)
    except AttributeError:
        return False
    return True


class ModelSharder:
    """Replace a model's modules according to ``policy`` (in place)."""

    def __init__(self, model: nn.Module, policy: Policy, process_group, parts: dict | None = None) -> None:
        self.model = model
        self.policy = policy
        self.process_group = process_group
        #: ``{path: policy}`` of a composite's parts (:meth:`CompositePolicy.part_policies
        #: <shardcore.CompositePolicy.part_policies>`), each planned by its own policy
        self.parts = parts or {}
        self.sequence = None  # the sequence split (SequenceParallel) the TP regions' entries follow

    def plan(self) -> list[tuple[str, nn.Module, ModulePolicyDescription]]:
        """Every module a description applies to, checked before anything changes (no collective).

        A composite policy's parts (:class:`~shardcore.composite.CompositePolicy`) are planned by
        their own policies, each on its sub-module alone; its own descriptions match outside them."""
        descriptions = self.policy.module_policy()
        by_name = {k for k in descriptions if isinstance(k, str)}
        parts = self.parts
        plan = []
        for name, module in self.model.named_modules():
            if any(name == path or name.startswith(f"{path}.") for path in parts):
                continue  # the part's own policy plans it
            desc = None
            for cls in type(module).__mro__:
                desc = descriptions.get(cls) or (
                    descriptions.get(f"{cls.__module__}.{cls.__qualname__}") if by_name else None
                )
                if desc is not None:
                    break
            if desc is None:
                continue
            for sub in [*desc.enter_tp_region, *desc.per_rank_rng, *desc.shared_rng]:
                if not _has(module, sub):
                    raise AttributeError(
                        f"{type(self.policy).__name__}: {type(module).__name__} at '{name or '<root>'}' has no "
                        f"submodule '{sub}' (named in enter_tp_region / per_rank_rng / shared_rng)"
                    )
            for sub in desc.sub_module_replacement:
                if sub.kwargs.get("copy_input") is False and not any(
                    sub.suffix.startswith(f"{entry}.") for entry in desc.enter_tp_region
                ):
                    raise ValueError(
                        f"{type(self.policy).__name__}: '{sub.suffix}' of {type(module).__name__} is built with "
                        "copy_input=False, but no enter_tp_region entry holds it: its input would never enter the "
                        "tensor-parallel region and the backward all-reduce of its input gradient would be missing; "
                        "name its parent module in enter_tp_region (or build it with copy_input=True)"
                    )
                if not sub.ignore_if_not_exist and not _has(module, sub.suffix):
                    raise AttributeError(
                        f"{type(self.policy).__name__}: {type(module).__name__} at '{name or '<root>'}' has no "
                        f"submodule '{sub.suffix}' (set ignore_if_not_exist=True if it is optional)"
                    )
            plan.append((name, module, desc))
        for path, policy in parts.items():
            inner = ModelSharder(self.model.get_submodule(path), policy, self.process_group)
            plan += [(f"{path}.{name}" if name else path, module, desc) for name, module, desc in inner.plan()]
        return plan

    def shard(self, plan: list[tuple[str, nn.Module, ModulePolicyDescription]] | None = None) -> nn.Module:
        """Replace modules following ``plan`` (default: :meth:`plan`, computed now)."""
        plan = self.plan() if plan is None else plan
        shared = self._shared_parameters()
        for name, module, desc in plan:
            for attr, value in desc.attribute_replacement.items():
                _set(module, attr, value)
            for fn in desc.param_replacement:
                fn(module)
            for sub in desc.sub_module_replacement:
                if not _has(module, sub.suffix):
                    continue
                native = _get(module, sub.suffix)
                if is_lora_layer(native):  # PEFT's LoRA around it: its base sharded, then its adapters
                    native.base_layer = sub.target_module.from_native_module(
                        native.base_layer, self.process_group, **sub.kwargs
                    )
                    shard_lora_layer(native, f"{name}.{sub.suffix}" if name else sub.suffix)
                    continue
                _set(module, sub.suffix, sub.target_module.from_native_module(native, self.process_group, **sub.kwargs))
            for method, fn in desc.method_replacement.items():
                setattr(module, method, types.MethodType(fn, module))
            if getattr(getattr(self.policy, "shard_config", None), "inference_only", False):
                continue  # no backward all-reduce hooks, no per-rank random streams
            for suffix in desc.enter_tp_region:
                enter_tp_region(_get(module, suffix), self.process_group, sequence=self.sequence)
            for suffix in desc.per_rank_rng:
                run_in_tp_rng(_get(module, suffix), self.process_group)
            for suffix in desc.shared_rng:
                run_in_shared_rng(_get(module, suffix))
        self._retie(shared)
        return self.model

    def _shared_parameters(self) -> list[list[tuple[str, str]]]:
        """Groups of (module path, param name) that hold one Parameter (tied weights)."""
        owners: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for mod_name, module in self.model.named_modules(remove_duplicate=False):
            for p_name, param in module.named_parameters(recurse=False):
                owners[id(param)].append((mod_name, p_name))
        return [places for places in owners.values() if len({m for m, _ in places}) > 1]

    def _retie(self, shared: list[list[tuple[str, str]]]) -> None:
        """Make parameters that were one before sharding one again (tied embeddings, tied biases).

        A parallel layer's slice wins over a native module's full tensor: the native owner (e.g.
        an MLM head's ``bias`` tied to its replaced ``decoder.bias``) is pointed at the slice.
        """
        for places in shared:
            owners = [(_get(self.model, m) if m else self.model, p) for m, p in places]
            specs = [getattr(mod, "shard_specs", {}).get(name) for mod, name in owners]
            sharded = [(getattr(mod, name), spec) for (mod, name), spec in zip(owners, specs, strict=True) if spec]
            keep = sharded[0][0] if sharded else getattr(*owners[0])
            for param, spec in sharded[1:]:
                if param.shape != keep.shape or spec != sharded[0][1]:
                    raise ValueError(
                        f"tied parameters {places} were sharded differently ({sharded[0][1]} vs {spec}); "
                        "a policy must shard tied weights the same way"
                    )
            for mod, name in owners:
                if getattr(mod, name) is not keep:
                    setattr(mod, name, keep)


def check_same_weights(model: nn.Module, group) -> None:
    """Collective: fail on every rank if the ranks hold different weights before sharding."""
    params = [p for p in model.parameters() if p.device.type != "meta"]
    if not params:
        return
    with torch.no_grad():
        stats = torch.stack([torch.stack([p.double().sum(), p.double().abs().sum()]) for p in params]).flatten()
    where = "the same-weights check of optimize (every rank of the group calls optimize)"
    gathered = all_gather_cat(stats.unsqueeze(0), group, 0, where=where)  # bounded and counted, as every collective
    if any(not torch.equal(g, gathered[0]) for g in gathered):
        raise RuntimeError(
            "the ranks hold different weights before sharding; build the model after seeding every rank "
            "the same way (torch.manual_seed) or load the same checkpoint on every rank"
        )


def resolve_policy(model: nn.Module, policy: Policy | type[Policy] | None = None) -> Policy:
    """The policy for ``model``: ``policy`` (an instance or a :class:`~shardcore.Policy` subclass) or,
    if ``None``, the installed plugins' policy for ``type(model)`` (matched along its MRO), or, when
    no plugin covers it, the tensor-parallel plan a HuggingFace model ships (zero-config: see
    :func:`shardcore.plan.zero_config_policy`). Plugins always win. No collective."""
    if policy is None:
        from .plugins import NoPolicyError, get_policy

        try:
            policy = get_policy(model)
        except NoPolicyError as err:
            from .plan import zero_config_policy
            from .plugins import warn_broken_plugins

            policy = zero_config_policy(model)
            warn_broken_plugins(type(model).__name__, policy)
            if policy is None:
                raise NoPolicyError(
                    f"{err}\nNor does the model ship a tensor-parallel plan (config.base_model_tp_plan)."
                ) from None
    elif isinstance(policy, type):
        policy = policy()
    if not isinstance(policy, Policy):
        raise TypeError(f"policy must be a shardcore.Policy (instance or subclass), got {policy!r}")
    policy.set_model(model)
    return policy


def check_policy_features(model: nn.Module, policy: Policy, config: ShardConfig) -> None:
    """Refuse a ``config`` feature the policy does not honour (before any collective)."""
    if config.parallel_output and not policy.tensor_parallel().parallel_output:
        raise NotImplementedError(
            f"{type(model).__name__}: {type(policy).__name__} does not support ShardConfig(parallel_output=True) "
            "(vocab-split logits and loss) yet; leave it False: logits are gathered and the loss is the unsharded one."
        )
