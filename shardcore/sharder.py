"""``ModelSharder`` applies a :class:`~shardcore.Policy` to a model, and ``optimize`` wires it up."""

from __future__ import annotations

import types
from collections import defaultdict

import attrs
import torch
import torch.distributed as dist
from torch import nn

from . import consistency, distributed, kernels
from .config import ShardConfig
from .data_parallel import apply_data_parallel, check_data_parallel
from .distributed import ParallelLayout
from .distributed.collectives import group_size, resolve_timeout, set_collective_timeout
from .distributed.groups import prepare_replica_groups
from .grad_norm import register_model
from .integrations.hf import install_save_pretrained
from .integrations.hf.peft import (
    check_lora,
    is_lora_layer,
    peft_base_model,
    shard_lora_layer,
    shard_new_adapters,
    watch_adapters,
)
from .meta import guard_meta
from .pipeline import build_pipeline, check_pipeline
from .policy import ModulePolicyDescription, Policy
from .sequence import apply_sequence_parallel, apply_ulysses, check_sequence_parallel
from .sharded_state import parameter_specs
from .tensor_parallel.mappings import shared_copies
from .tensor_parallel.regions import SequenceParallel, enter_tp_region
from .tensor_parallel.rng import run_in_shared_rng, run_in_tp_rng

__all__ = ["ModelSharder", "ShardInfo", "optimize", "resolve_policy"]


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

    def __init__(self, model: nn.Module, policy: Policy, process_group) -> None:
        self.model = model
        self.policy = policy
        self.process_group = process_group
        self.sequence = None  # the sequence split (SequenceParallel) the TP regions' entries follow

    def plan(self) -> list[tuple[str, nn.Module, ModulePolicyDescription]]:
        """Every module a description applies to, checked before anything changes (no collective)."""
        descriptions = self.policy.module_policy()
        by_name = {k for k in descriptions if isinstance(k, str)}
        plan = []
        for name, module in self.model.named_modules():
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


def _check_same_weights(model: nn.Module, group) -> None:
    """Collective: fail on every rank if the ranks hold different weights before sharding."""
    params = [p for p in model.parameters() if p.device.type != "meta"]
    if not params:
        return
    with torch.no_grad():
        stats = torch.stack([torch.stack([p.double().sum(), p.double().abs().sum()]) for p in params]).flatten()
    gathered = [torch.empty_like(stats) for _ in range(group_size(group))]
    dist.all_gather(gathered, stats, group=group)
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

            policy = zero_config_policy(model)
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
    if config.parallel_output and not policy.supports_parallel_output:
        raise NotImplementedError(
            f"{type(model).__name__}: {type(policy).__name__} does not support ShardConfig(parallel_output=True) "
            "(vocab-split logits and loss) yet; leave it False: logits are gathered and the loss is the unsharded one."
        )


def optimize(
    model: nn.Module, config: ShardConfig | None = None, *, policy: Policy | type[Policy] | None = None
) -> nn.Module:
    """Shard ``model`` in place over the tensor-parallel group and return it.

    The policy comes from the installed plugins, matched on ``type(model)``'s MRO, unless
    ``policy`` (an instance or a subclass of :class:`~shardcore.Policy`) is given. Every check
    runs before the first collective, so bad input fails on every rank alike: first the parallel
    layout against the world size, then features not built yet, then the policy's own checks.
    """
    if getattr(model, "shardcore", None) is not None:
        raise RuntimeError(f"{type(model).__name__} is already sharded by shardcore; optimize it once")
    inner = peft_base_model(model)
    if inner is not None:  # a PEFT model: shard the model it wraps (its LoRA layers with it), keep the wrapper
        model.shardcore = optimize(inner, config, policy=policy).shardcore
        register_model(model)
        return model
    config = ShardConfig() if config is None else config
    if not isinstance(config, ShardConfig):
        raise TypeError(f"config must be a shardcore.ShardConfig, got {type(config).__name__}")
    timeout = resolve_timeout(config.collective_timeout)  # a malformed environment value fails here
    distributed.init_from_env(timeout)
    layout = ParallelLayout.from_config(config)
    config.check_built()
    tp_size = layout.tp

    if config.plan is not None:
        if policy is not None:
            raise ValueError(
                "optimize: ShardConfig(plan=...) and policy=... both say how to shard the model; pass one of them"
            )
        from .plan import PlanPolicy

        policy = PlanPolicy(config.plan)  # reads and checks the plan's syntax: no collective
    policy = resolve_policy(model, policy)
    policy.set_shard_config(config, tp_size)
    check_policy_features(model, policy, config)
    policy.config_sanity_check()
    check_data_parallel(model, policy, config, layout)
    stages = check_pipeline(model, policy, config, layout) if layout.pp > 1 else None
    sequence_mode = check_sequence_parallel(model, policy, config, layout)
    # with data or pipeline parallelism every rank of the world starts from the same weights
    whole_world = layout.pp > 1 or layout.sp > 1 or (config.data_parallel is not None and layout.dp > 1)
    if tp_size == 1 or not config.enable_tensor_parallelism:
        check_lora(model, config)
        applied = kernels.apply(model, policy, config)
        kernels.apply_jit(model, policy, config, applied)
        _freeze_for_inference(model, config)
        if whole_world:
            _check_same_weights(model, dist.group.WORLD)
            if sequence_mode in ("all_to_all", "ring_attn"):
                _ulysses(model, policy, config, layout, sequence_mode)
            pipeline = build_pipeline(model, policy, config, layout, *stages) if stages else None
            data_parallel = apply_data_parallel(model, policy, config, layout)
            model.shardcore = ShardInfo(
                config, tp_size, layout.group("tp"), policy, layout, applied, data_parallel, pipeline
            )
            register_model(model)
            install_save_pretrained(model)
        guard_meta(model)
        return model

    model = policy.preprocess()
    sharder = ModelSharder(model, policy, None)
    plan = sharder.plan()  # module_policy and its structural checks: still no collective
    check_lora(model, config, plan)  # PEFT adapters where they are not built yet: still none
    applied = kernels.apply(model, policy, config)  # attention backend, fused norms: still none
    group = config.tensor_parallel_process_group
    if group is None:
        group = layout.group("tp")
    _check_same_weights(model, dist.group.WORLD if whole_world else group)
    sharder.process_group = group
    # the replica sub-groups layers with replicated heads use: made now, on every rank, not in a constructor
    prepare_replica_groups(group, None if config.tensor_parallel_process_group is not None else layout.tp_groups())
    split_gather = sequence_mode == "split_gather"
    sequence = None
    if split_gather:
        sequence = SequenceParallel(group, group_size(group), sequence_mode, overlap=config.enable_sequence_overlap)
    sharder.sequence = sequence
    model = sharder.shard(plan)
    model = policy.postprocess()
    if sequence is not None:
        apply_sequence_parallel(model, policy, sequence)
    if sequence_mode in ("all_to_all", "ring_attn"):
        _ulysses(model, policy, config, layout, sequence_mode)
    kernels.apply_jit(model, policy, config, applied)
    if policy.share_tp_copies:
        _share_copies_per_forward(model)
    set_collective_timeout(resolve_timeout(config.collective_timeout))
    consistency.install(model, group, config)
    _freeze_for_inference(model, config)
    pipeline = build_pipeline(model, policy, config, layout, *stages) if stages else None  # prunes the stages
    data_parallel = apply_data_parallel(model, policy, config, layout)  # last: wraps the sharded model
    if data_parallel is None:  # a DDP over the whole world (accelerate's prepare) leaves the slices alone
        model._ddp_params_and_buffers_to_ignore = sorted(parameter_specs(model))
    model.shardcore = ShardInfo(config, tp_size, group, policy, layout, applied, data_parallel, pipeline)
    register_model(model)
    install_save_pretrained(model)
    # LoRA added after optimize: cut when peft sets its layer in (so merge_and_unload is right before
    # any forward), and adapters added to a wrapped layer before the next forward (and its input check)
    watch_adapters()
    model.register_forward_pre_hook(lambda module, args: shard_new_adapters(module), prepend=True)
    guard_meta(model)
    return model


def _ulysses(model: nn.Module, policy: Policy, config: ShardConfig, layout: ParallelLayout, mode: str) -> None:
    """``all_to_all`` or ``ring_attn`` over the mesh's ``sp`` dim, and (``check_inputs``) the same
    batch on its ranks."""
    group = layout.group("sp")
    apply_ulysses(model, policy, SequenceParallel(group, layout.sp, mode))
    if config.check_inputs:
        name = type(model).__name__

        def same_inputs(module, args, kwargs):
            consistency.check_inputs(group, f"{name}.forward (sequence-parallel group)", args, kwargs)

        model.register_forward_pre_hook(same_inputs, with_kwargs=True, prepend=True)


def _share_copies_per_forward(model: nn.Module) -> None:
    """Open a :func:`~shardcore.tensor_parallel.mappings.shared_copies` scope for each forward of ``model``."""
    scopes: list = []

    def enter(module, args):
        scope = shared_copies()
        scope.__enter__()
        scopes.append(scope)

    def leave(module, args, output):
        if scopes:
            scopes.pop().__exit__(None, None, None)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)


def _freeze_for_inference(model: nn.Module, config: ShardConfig) -> None:
    """``inference_only``: eval mode, frozen parameters, and a clear error (first, before any
    collective) if the model is put back in training mode."""
    if not config.inference_only:
        return
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    name = type(model).__name__

    def refuse_training(module, args, kwargs):
        if module.training:
            raise RuntimeError(
                f"{name} was sharded with ShardConfig(inference_only=True): its backward all-reduce hooks and "
                "per-rank random streams were left out, so it cannot train; call model.eval(), or shard it "
                "without inference_only to train it"
            )

    model.register_forward_pre_hook(refuse_training, with_kwargs=True, prepend=True)
