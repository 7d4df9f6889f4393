""":func:`shard` (``shardcore.optimize``'s steps): one ordered list of named steps, the same for every layout.

Each step reads and extends one :class:`Build`. The checks come first and issue no collective, so
bad input fails on every rank alike and leaves nobody waiting; the first collective is the
same-weights check. A step that has nothing to do for a layout (sharding at TP=1, the pipeline
without ``pp``) returns at once: no layout runs its own copy of the order.

    layout -> policy -> checks -> plan -> kernels -> same_weights -> probe -> shard -> sequence -> jit
           -> guards -> verify -> pipeline -> data_parallel -> register

``STEPS`` is public: tools run a prefix of it (``shardcore explain``: the checks on paper), tests name the step that failed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch.distributed as dist
from torch import nn

from . import consistency, distributed, kernels, verify
from .amp import install_overflow_agreement
from .attach import attached
from .checkpoint.foreign import refuse_foreign_state_dicts
from .composite import CompositePolicy
from .config import OVER_SP_MODES, ShardConfig
from .data_parallel import apply_data_parallel, check_data_parallel
from .data_parallel.outer import set_outer_ddp_ignore
from .distributed import ParallelLayout
from .distributed.collectives import Scope, enter_scope_per_forward, group_size, resolve_timeout, set_collective_timeout
from .distributed.groups import prepare_replica_groups
from .distributed.simulate import is_simulated, without_data_checks
from .expert_parallel import check_expert_parallel
from .expert_parallel import install as install_expert_parallel
from .grad_mark import mark_gradients
from .grad_norm import register_model
from .integrations.hf import install_save_pretrained
from .integrations.hf.checkpointing import carry_into_checkpoints
from .integrations.hf.peft import check_lora, peft_base_model, shard_new_adapters, watch_adapters
from .meta import guard_meta
from .moved import renamed
from .pipeline import build_pipeline, check_pipeline
from .policy import Policy
from .sequence import apply_sequence_parallel, apply_ulysses, check_sequence_parallel
from .sharded_state import parameter_specs
from .sharder import ModelSharder, ShardInfo, check_policy_features, check_same_weights, resolve_policy
from .tensor_parallel.grad_sum import sum_named_gradients
from .tensor_parallel.regions import SequenceParallel, share_copies_per_forward
from .tensor_parallel.rng import STREAMS

__all__ = ["PAPER_STEPS", "STEPS", "Build", "run_steps", "shard"]


@attrs.define
class Build:
    """What the steps of :func:`optimize` share: the model and what each step found or made."""

    model: nn.Module
    config: ShardConfig
    policy: Any = None  # an instance or a subclass of Policy, or None: the plugins'
    layout: ParallelLayout | None = None
    group: Any = None  # the tensor-parallel group (``shardcore explain`` presets a PaperGroup)
    sharder: ModelSharder | None = None
    plan: list | None = None
    stages: tuple | None = None
    sequence_mode: str | None = None
    applied: dict = attrs.field(factory=dict)
    pipeline: Any = None
    data_parallel: str | None = None
    scope: Scope | None = None  # the model's collectives: their bound and counts
    probe: Any = None  # the unsharded blocks' results, for ShardConfig(verify=...)
    #: what a block recomputed by activation checkpointing must see as its forward did (the sequence split)
    recompute: list = attrs.field(factory=list)

    @property
    def tensor_parallel(self) -> bool:
        return self.layout.tp > 1 and self.config.enable_tensor_parallelism

    @property
    def expert_parallel(self) -> bool:
        return self.layout.ep > 1

    @property
    def whole_world(self) -> bool:
        """With data, pipeline or sequence parallelism every rank of the world starts from the same weights."""
        lay = self.layout
        return lay.pp > 1 or lay.sp > 1 or (self.config.data_parallel is not None and lay.dp > 1)

    @property
    def sharded(self) -> bool:
        """Whether the model becomes a sharded model (``model.shardcore``); else it is returned as it was."""
        return self.tensor_parallel or self.whole_world


def _layout(b: Build) -> None:
    timeout = resolve_timeout(b.config.collective_timeout)  # a malformed environment value fails here
    distributed.init_from_env(timeout)
    set_collective_timeout(timeout)  # collectives outside a model's forward (clipping, saving); the groups' timeouts
    if is_simulated():  # one rank of a larger world on the fake backend: no check that compares data
        b.config = without_data_checks(b.config)
    b.layout = ParallelLayout.from_config(b.config)
    b.config = b.layout.completed(b.config)  # the sizes a caller's mesh gives, filled in


def _policy(b: Build) -> None:
    if b.config.plan is not None:
        if b.policy is not None:
            raise ValueError(
                "optimize: ShardConfig(plan=...) and policy=... both say how to shard the model; pass one of them"
            )
        from .plan import DERIVE, PlanPolicy, derived_policy

        derive = b.config.plan == DERIVE  # from the model's modules, verified as any plan we did not write
        b.policy = derived_policy(b.model) if derive else PlanPolicy(b.config.plan)  # no collective
    b.policy = resolve_policy(b.model, b.policy)
    b.policy.set_shard_config(b.config, b.layout.tp)
    b.policy.layout = b.layout  # every degree (the experts' groups come from it)


def _checks(b: Build) -> None:
    """Everything about the layout that can be wrong, found before any collective; the model is
    left as it is (``explain --auto`` checks every candidate layout on one model)."""
    model, policy, config, layout = b.model, b.policy, b.config, b.layout
    check_policy_features(model, policy, config)
    policy.config_sanity_check()
    check_data_parallel(model, policy, config, layout)
    b.stages = check_pipeline(model, policy, config, layout) if layout.pp > 1 else None
    b.sequence_mode = check_sequence_parallel(model, policy, config, layout)
    check_expert_parallel(model, policy, config, layout)


def _plan(b: Build) -> None:
    """The policy's preprocessing and its sharding plan, with their structural checks (no collective)."""
    if b.tensor_parallel or b.expert_parallel:
        b.model = b.policy.preprocess()
        parts = b.policy.part_policies() if isinstance(b.policy, CompositePolicy) else None
        b.sharder = ModelSharder(b.model, b.policy, None, parts)
        b.plan = b.sharder.plan()  # module_policy and its structural checks
    check_lora(b.model, b.config, b.plan)  # PEFT adapters where they are not built yet


def _kernels(b: Build) -> None:
    b.applied = kernels.apply(b.model, b.policy, b.config)  # attention backend, fused norms: no collective


def _same_weights(b: Build) -> None:
    """The first collective: every rank holds the same weights before anything is cut."""
    if (b.tensor_parallel or b.whole_world) and not is_simulated():
        check_same_weights(b.model, dist.group.WORLD if b.whole_world else _tp_group(b))


def _probe(b: Build) -> None:
    """While the weights are whole: the unsharded blocks' results, for ``ShardConfig.verify`` (no collective)."""
    b.probe = verify.probe(b.model, b.policy, b.config, b.tensor_parallel)


def _verify(b: Build) -> None:
    """The sharded blocks and model against the probe; the first backward's gradient check armed."""
    verify.verify(b.model, b.policy, b.config, b.group, b.probe, b.tensor_parallel)


def _tp_group(b: Build):
    return b.config.tensor_parallel_process_group or b.layout.group("tp")


def _shard(b: Build) -> None:
    b.group = (b.group or _tp_group(b)) if b.sharded else None
    if not (b.tensor_parallel or b.expert_parallel):
        return
    b.sharder.process_group = b.group
    # the replica sub-groups layers with replicated heads use: made now, on every rank, not in a constructor
    tp_groups = None if b.config.tensor_parallel_process_group is not None else b.layout.tp_groups()
    prepare_replica_groups(b.group, tp_groups)
    if b.expert_parallel:  # the expert layers' groups: made now, on every rank, not in a constructor
        b.layout.expert_groups()
    if b.sequence_mode == "split_gather":
        overlap = b.config.enable_sequence_overlap
        b.sharder.sequence = SequenceParallel(b.group, group_size(b.group), b.sequence_mode, overlap=overlap)
        b.recompute.append(b.sharder.sequence)
    b.model = b.sharder.shard(b.plan)
    b.model = b.policy.postprocess()
    sum_named_gradients(b.model, b.policy.tensor_parallel().grad_sum, b.group, type(b.policy).__name__)


def _sequence(b: Build) -> None:
    if b.sharder is not None and b.sharder.sequence is not None:
        apply_sequence_parallel(b.model, b.policy, b.sharder.sequence)
    if b.sequence_mode in OVER_SP_MODES:
        group = b.layout.group("sp")
        state = SequenceParallel(group, b.layout.sp, b.sequence_mode)
        apply_ulysses(b.model, b.policy, state)
        b.recompute.append(state)
        consistency.install_sequence_check(b.model, group, b.config)  # the same batch on the sequence ranks


def _jit(b: Build) -> None:
    kernels.apply_jit(b.model, b.policy, b.config, b.applied)


def _guards(b: Build) -> None:
    """Bounded collectives, the input check and shared copies for a sharded model; inference_only."""
    if b.sharded:
        if b.tensor_parallel and b.policy.tensor_parallel().share_copies:
            share_copies_per_forward(b.model)
        b.scope = Scope(type(b.model).__name__, resolve_timeout(b.config.collective_timeout))  # this model's bound
        consistency.install(b.model, b.group, b.config)
        if not b.config.inference_only:  # before data parallelism wraps the model: FSDP's backward work first
            install_overflow_agreement(b.model, dist.group.WORLD if b.whole_world else b.group, b.config)
    consistency.freeze_for_inference(b.model, b.config)


def _pipeline(b: Build) -> None:
    if b.stages is not None:
        b.pipeline = build_pipeline(b.model, b.policy, b.config, b.layout, *b.stages)  # prunes the stages


def _data_parallel(b: Build) -> None:
    if not b.sharded:
        return
    b.data_parallel = apply_data_parallel(b.model, b.policy, b.config, b.layout, b.pipeline)  # wraps model or stages
    install_expert_parallel(b.model, b.policy, b.config, b.layout)  # expert gradients averaged as DDP's
    mode = b.config.data_parallel if b.data_parallel is not None else None  # a DDP from outside: right or refused
    set_outer_ddp_ignore(b.model, mode, b.layout, list(parameter_specs(b.model)))


def _register(b: Build) -> None:
    model = b.model
    if b.sharded:
        found = (b.config, b.layout.tp, b.group, b.policy, b.layout, b.applied, b.data_parallel, b.pipeline, b.scope)
        model.shardcore = ShardInfo(*found, attached=attached(model))  # print(model.shardcore): what is attached
        register_model(model), mark_gradients(model)  # its norm, model.clip_grad_norm_, the mark torch's norm reads
        install_save_pretrained(model), refuse_foreign_state_dicts(model)  # DCP's state-dict API: refused by name
        carry_into_checkpoints(model, [STREAMS, *b.recompute])  # HF gradient checkpointing recomputes exactly
    if b.tensor_parallel:
        # LoRA added after optimize: cut when peft sets its layer in, or before the next forward
        watch_adapters(model)
        attached(model).before_forward(
            model, "new_adapters", lambda module, args: shard_new_adapters(module), what="LoRA added since: cut"
        )
    guard_meta(model)
    if b.scope is not None:  # first before the forward, last after it (shardcore.attach's order)
        enter_scope_per_forward(model, b.scope)


#: The order of :func:`optimize`, by name.
_ORDER = (_layout, _policy, _checks, _plan, _kernels, _same_weights, _probe, _shard, _sequence, _jit, _guards, _verify)
STEPS: list[tuple[str, Callable[[Build], None]]] = [
    (step.__name__.lstrip("_"), step) for step in (*_ORDER, _pipeline, _data_parallel, _register)
]


#: The steps ``shardcore explain`` runs on a paper layout (a world of paper ranks): policy, checks, sharding.
PAPER_STEPS = ("policy", "checks", "plan", "shard")


def run_steps(build: Build, names: tuple[str, ...]) -> Build:
    """Run the steps ``names`` of :data:`STEPS` on ``build``, in :data:`STEPS`' order."""
    unknown = set(names) - {name for name, _ in STEPS}
    if unknown:
        raise KeyError(f"no optimize step named {sorted(unknown)}; the steps are {[name for name, _ in STEPS]}")
    for name, step in STEPS:
        if name in names:
            step(build)
    return build


def shard(
    model: nn.Module, config: ShardConfig | None = None, *, policy: Policy | type[Policy] | None = None
) -> nn.Module:
    """Shard ``model`` in place and return it: the steps of ``shardcore.optimize``, the public entry.

    The policy comes from the installed plugins (matched on ``type(model)``'s MRO) unless ``policy`` (a
    :class:`~shardcore.Policy` or subclass) is given. The steps run in :data:`STEPS`' order, every check before
    the first collective: bad input (the layout against the world, features not built) fails on every rank alike."""
    if getattr(model, "shardcore", None) is not None:
        raise RuntimeError(f"{type(model).__name__} is already sharded by shardcore; optimize it once")
    inner = peft_base_model(model)
    if inner is not None:  # a PEFT model: shard the model it wraps (its LoRA layers with it), keep the wrapper
        model.shardcore = shard(inner, config, policy=policy).shardcore
        register_model(model), mark_gradients(model)
        return model
    config = ShardConfig() if config is None else config
    if not isinstance(config, ShardConfig):
        raise TypeError(f"config must be a shardcore.ShardConfig, got {type(config).__name__}")
    if config.auto is not None:
        raise ValueError(
            "ShardConfig(auto=...) is chosen by shardcore.optimize before sharding, not here (shardcore.parallelize "
            "or the optimize module's own function): set the layout, e.g. as `shardcore explain MODEL --auto` prints it"
        )
    build = Build(model, config, policy)
    for name, step in STEPS:
        attached(build.model).step = name  # what each step attaches is recorded under its name
        step(build)
    attached(build.model).finish(build.model)  # its hooks first before the forward: before data parallelism's
    return build.model


__getattr__ = renamed(__name__, {"optimize": "shard"}, hint="call shardcore.optimize, the public one")  # 0.1's name
