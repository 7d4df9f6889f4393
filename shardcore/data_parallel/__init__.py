"""Data parallelism on the mesh's ``dp`` dimension: FSDP2 per block, or DDP, composed with TP.

``ShardConfig(data_parallel="fsdp")`` calls :func:`torch.distributed.fsdp.fully_shard` on every
block of :meth:`shardcore.Policy.blocks` and then on the model (embedding, head, final norm),
over the ``dp`` sub-mesh of :class:`~shardcore.ParallelLayout`: each parameter, already a
tensor-parallel slice, is split once more along its first dimension over the data-parallel
ranks, all-gathered block by block for forward and backward, and its gradient reduce-scattered
(averaged) over them. ``data_parallel="ddp"`` keeps whole (tensor-parallel) parameters on each
replica and all-reduces (averages) gradients, through PyTorch's composable ``replicate`` (DDP's
bucketed reducer). Either way the module tree, the parameter names and the model's forward stay
the model's own.

Each data-parallel rank feeds its own part of the global batch; the gradients are the mean of
the ranks' gradients, so with each rank's loss the mean over its part, they equal the
full-batch gradients when the parts are of equal size (and hold equal numbers of label tokens).

Under FSDP a parameter is a :class:`~torch.distributed.tensor.DTensor` on the ``dp`` mesh whose
global shape is the tensor-parallel slice; :func:`dp_full` and :func:`dp_assign` convert between
that and the plain slice, for :func:`shardcore.full_named_tensors` and the checkpoints.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from ..config import SHARDED_MODES
from .idle import install_idle_runs, stage_takers

__all__ = [
    "apply_data_parallel",
    "check_data_parallel",
    "dp_assign",
    "dp_full",
    "dp_local",
    "local_nbytes",
    "native_class",
    "reshard",
    "stage_takers",
]

log = logging.getLogger("shardcore")


def is_dtensor(tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def dp_full(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """The whole tensor-parallel slice of ``tensor``: itself, or, for an FSDP-sharded DTensor, its
    data-parallel shards gathered (a collective over ``dp``: every rank of it must call)."""
    if tensor is None or not is_dtensor(tensor):
        return tensor
    full = tensor.full_tensor()
    # torch may hand back an AsyncCollectiveTensor, a wrapper with no storage of its own: point-to-point
    # sends read a tensor's memory directly, so wait for the plain tensor (no copy)
    wait = getattr(full, "wait", None)
    return wait() if callable(wait) else full


def dp_local(tensor: torch.Tensor) -> torch.Tensor:
    """What this rank holds of ``tensor``: an FSDP DTensor's local shard, else ``tensor`` (no communication)."""
    return tensor.to_local() if is_dtensor(tensor) else tensor


def dp_assign(tensor: torch.Tensor, full: torch.Tensor) -> None:
    """Copy ``full`` (a whole tensor-parallel slice) into ``tensor``: in place, or for an
    FSDP-sharded DTensor into this rank's data-parallel shard of it (no communication)."""
    with torch.no_grad():
        if not is_dtensor(tensor):
            tensor.copy_(full)
            return
        from torch.distributed.tensor import distribute_tensor

        mine = distribute_tensor(full.to(tensor.dtype), tensor.device_mesh, tensor.placements, src_data_rank=None)
        tensor.to_local().copy_(mine.to_local())


def reshard(model: nn.Module) -> nn.Module:
    """Make sure ``model``'s FSDP-managed modules hold their sharded parameters (after a forward
    FSDP may leave a module's parameters gathered, with their memory freed when it reshards), so
    that ``named_parameters()`` yields the data-parallel shards. No communication; a no-op without FSDP."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch 2.13+ has it
        return model
    pipeline = getattr(getattr(model, "shardcore", None), "pipeline", None)
    stages = list(pipeline.submods.values()) if pipeline is not None else []  # roots outside model.modules()
    for module in [*model.modules(), *stages]:
        if isinstance(module, FSDPModule):
            module.reshard()
    return model


def local_nbytes(tensor: torch.Tensor) -> int:
    """Bytes this rank holds of ``tensor`` (its data-parallel shard, for a DTensor)."""
    local = dp_local(tensor)
    return local.numel() * local.element_size()


def native_class(model: nn.Module) -> type:
    """The model's own class: FSDP2 and DDP's composable ``replicate`` swap a module's class for a
    subclass named ``FSDP<Class>`` / ``DDP<Class>``."""
    from torch.distributed._composable.replicate import DDP
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(model).__mro__ if not issubclass(c, (FSDPModule, DDP)))


def check_data_parallel(model: nn.Module, policy, config, layout) -> None:
    """Refuse what ``config.data_parallel`` cannot run, before any collective (same on every rank)."""
    mode = config.data_parallel
    if mode is None:
        return
    if config.tensor_parallel_process_group is not None:
        raise ValueError(
            f"ShardConfig(data_parallel={mode!r}) runs on shardcore's device mesh, but a "
            "tensor_parallel_process_group was given; leave it out and let tensor_parallel_size and "
            "data_parallel_size cut the world"
        )
    if mode in SHARDED_MODES:
        try:
            blocks = policy.blocks()
        except NotImplementedError as err:
            raise NotImplementedError(
                f"ShardConfig(data_parallel={mode!r}) wraps each block of {type(policy).__name__}.blocks(), which "
                f"this policy does not implement ({err}); use data_parallel='ddp' or implement blocks()"
            ) from None
        if not blocks:
            raise ValueError(f"ShardConfig(data_parallel={mode!r}): {type(policy).__name__}.blocks() is empty")
        why = policy.data_parallel().sharded_refusal
        if why:
            raise NotImplementedError(
                f"ShardConfig(data_parallel={mode!r}): {type(model).__name__}: {why}; use data_parallel='ddp', "
                "which finds each step the parameters a rank left without a gradient"
            )
        scalars = [n for n, p in model.named_parameters() if p.dim() == 0]
        if scalars:  # torch's fully_shard refuses them when it is called: said here, before any collective
            raise NotImplementedError(
                f"ShardConfig(data_parallel={mode!r}): {type(model).__name__} holds 0-d parameters {scalars[:3]}, "
                "which torch's fully_shard cannot split; use data_parallel='ddp' for this model"
            )
        grad_sum = policy.tensor_parallel().grad_sum
        if grad_sum and layout.tp > 1:
            raise NotImplementedError(
                f"ShardConfig(data_parallel={mode!r}): the plan gives {grad_sum[:3]} the spec "
                "replicated_with_grad_allreduce, whose gradient sums hook the parameters FSDP replaces; "
                "use data_parallel='ddp' for this plan"
            )
    shard = config.data_parallel_shard_size
    if mode == "hsdp" and (shard is None or layout.dp % shard):
        raise ValueError(
            f"ShardConfig(data_parallel='hsdp', data_parallel_shard_size={shard}): HSDP splits each parameter over "
            f"data_parallel_shard_size ranks and replicates that over the rest of the {layout.dp} data-parallel "
            f"ranks; give a data_parallel_shard_size that divides {layout.dp} (e.g. the GPUs of one node)"
        )
    if mode == "ddp" and config.inference_only:
        raise ValueError(
            "ShardConfig(data_parallel='ddp', inference_only=True): DDP only synchronizes gradients, and an "
            "inference-only model has none; leave data_parallel=None (each replica serves its own batch) or "
            "use data_parallel='fsdp' to split the weights over the data-parallel ranks"
        )


def dp_mesh(config, layout):
    """The mesh ``config.data_parallel`` runs on: the ``dp`` dim, or for ``"hsdp"`` a 2-D
    ``("dp_replicate", "dp_shard")`` mesh over the same ranks (collective on first use)."""
    if config.data_parallel == "hsdp":
        return layout.hsdp_mesh(config.data_parallel_shard_size)
    return layout.mesh()["dp"]


def dp_shard_group(config, layout):
    """The group whose ranks hold disjoint data-parallel shards of each parameter (``None`` under DDP,
    or without data parallelism): ``dp`` under FSDP and ZeRO-2, the shard dim of HSDP's mesh."""
    if config.data_parallel not in SHARDED_MODES or layout.dp == 1:
        return None
    mesh = dp_mesh(config, layout)
    return mesh.get_group(1) if config.data_parallel == "hsdp" else mesh.get_group()  # (replicate, shard)


def _fsdp_kwargs(model: nn.Module, policy, config, experts: list) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.tensor import Shard

    dims = policy.data_parallel().shard_dims
    placement = {id(p): Shard(dims[n]) for n, p in model.named_parameters(remove_duplicate=False) if n in dims}
    kwargs: dict = {"shard_placement_fn": (lambda p: placement.get(id(p)))} if placement else {}
    if experts:
        kwargs["ignored_params"] = {p for m in experts for p in m.parameters()}
    if config.mixed_precision is not None:  # compute in it, gradients reduced and weights kept in fp32
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=mixed_dtype(config), reduce_dtype=torch.float32)
    return kwargs


def mixed_dtype(config) -> torch.dtype | None:
    """The compute dtype ``config.mixed_precision`` names (``None``: none)."""
    return {None: None, "bf16": torch.bfloat16, "fp16": torch.float16}[config.mixed_precision]


def _roots(model: nn.Module, policy, pipeline) -> list[tuple[nn.Module, list[nn.Module]]]:
    """``[(root, its blocks)]``: the modules data parallelism wraps, each block its own FSDP unit;
    the model, or under pipeline parallelism each stage this rank runs."""
    if pipeline is None:
        return [(model, [block for _, block in policy.blocks()])]
    roots = [(st, st.blocks) for st in pipeline.submods.values()]
    owned = {id(p) for root, _ in roots for p in root.parameters()}
    outside = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in owned]
    if outside:
        raise NotImplementedError(
            f"{type(model).__name__}: pipeline stages with data parallelism: {outside[:4]} belong to no stage "
            f"(neither a block nor one of {type(policy).__name__}.pipeline().ends), so nothing would average "
            "their gradients over the data-parallel ranks; name their modules in pipeline_ends()"
        )
    return roots


def apply_data_parallel(model: nn.Module, policy, config, layout, pipeline=None) -> str | None:
    """Wrap ``model`` for ``config.data_parallel`` over the ``dp`` mesh dimension (collective).

    Under pipeline parallelism (``pipeline``: ``model.shardcore.pipeline``) each stage this rank
    runs is wrapped instead, as ``torch.distributed.pipelining`` expects: its blocks and then the
    stage (its end modules) by ``fully_shard``, or the stage by FSDP's ``replicate`` for DDP; the
    schedule then reduces gradients once, after the last microbatch.

    Returns what runs (``"fsdp"``, ``"zero2"``, ``"hsdp"``, ``"ddp"``) or ``None`` when there is
    nothing to do (``data_parallel=None`` or a data-parallel degree of 1).
    """
    mode = config.data_parallel
    if mode is None:
        return None
    if layout.dp == 1:
        log.info("shardcore: data_parallel=%r with data_parallel_size=1: nothing to shard or synchronize", mode)
        return None
    mesh = dp_mesh(config, layout)
    from ..expert_parallel import expert_modules

    experts = expert_modules(model)  # split over the expert-parallel ranks: averaged by their own hooks
    roots = _roots(model, policy, pipeline)
    if mode in SHARDED_MODES:
        from torch.distributed.fsdp import fully_shard

        kwargs = _fsdp_kwargs(model, policy, config, experts)
        if mode == "zero2":  # weights stay gathered from forward to backward: ZeRO-2's memory, no re-gather
            kwargs["reshard_after_forward"] = False
        for root, blocks in roots:
            for block in blocks:
                fully_shard(block, mesh=mesh, **kwargs)
            fully_shard(root, mesh=mesh, **kwargs)
    elif pipeline is not None:  # the stages reduce once per step: FSDP's replicate, which the schedule drives
        from torch.distributed._composable.replicate_with_fsdp import replicate

        ignored = {p for m in experts for p in m.parameters()} or None
        for root, _ in roots:
            replicate(root, mesh=mesh, ignored_params=ignored)
    else:
        from torch.distributed._composable.replicate import replicate

        spec = policy.data_parallel()  # static_graph: the same parameters every step, some never; find_unused:
        # some a step leaves without a gradient, not known which (a model shardcore did not write)
        kwargs = {"static_graph": spec.static_graph, "find_unused_parameters": spec.find_unused}
        replicate(model, process_group=mesh.get_group(), ignored_modules=experts or None, **kwargs)
    if pipeline is None:  # a rank whose batch lacks an input some modules need still runs them (.idle)
        install_idle_runs(model, policy.data_parallel().idle_runs)
    elif policy.data_parallel().idle_runs:
        stage_takers(model, policy.data_parallel().idle_runs)  # every rank: refused alike where it cannot run
        if 0 in pipeline.submods:  # the first stage takes the inputs and holds their modules
            install_idle_runs(model, policy.data_parallel().idle_runs, first_stage=pipeline.submods[0])
    log.info("shardcore: %s over %d data-parallel ranks", mode, layout.dp)
    return mode
