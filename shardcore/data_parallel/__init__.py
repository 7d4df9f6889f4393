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

__all__ = [
    "apply_data_parallel",
    "check_data_parallel",
    "dp_assign",
    "dp_full",
    "local_nbytes",
    "native_class",
    "reshard",
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
    return tensor.full_tensor()


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
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    return model


def local_nbytes(tensor: torch.Tensor) -> int:
    """Bytes this rank holds of ``tensor`` (its data-parallel shard, for a DTensor)."""
    local = tensor.to_local() if is_dtensor(tensor) else tensor
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
    if mode == "fsdp":
        try:
            blocks = policy.blocks()
        except NotImplementedError as err:
            raise NotImplementedError(
                f"ShardConfig(data_parallel='fsdp') wraps each block of {type(policy).__name__}.blocks(), which "
                f"this policy does not implement ({err}); use data_parallel='ddp' or implement blocks()"
            ) from None
        if not blocks:
            raise ValueError(f"ShardConfig(data_parallel='fsdp'): {type(policy).__name__}.blocks() is empty")
        grad_sum = getattr(policy, "grad_sum_parameters", [])
        if grad_sum and layout.tp > 1:
            raise NotImplementedError(
                f"ShardConfig(data_parallel='fsdp'): the plan gives {grad_sum[:3]} the spec "
                "replicated_with_grad_allreduce, whose gradient sums hook the parameters FSDP replaces; "
                "use data_parallel='ddp' for this plan"
            )
    if mode == "ddp" and config.inference_only:
        raise ValueError(
            "ShardConfig(data_parallel='ddp', inference_only=True): DDP only synchronizes gradients, and an "
            "inference-only model has none; leave data_parallel=None (each replica serves its own batch) or "
            "use data_parallel='fsdp' to split the weights over the data-parallel ranks"
        )


def apply_data_parallel(model: nn.Module, policy, config, layout) -> str | None:
    """Wrap ``model`` for ``config.data_parallel`` over the ``dp`` mesh dimension (collective).

    Returns what runs (``"fsdp"``, ``"ddp"``) or ``None`` when there is nothing to do
    (``data_parallel=None`` or a data-parallel degree of 1).
    """
    mode = config.data_parallel
    if mode is None:
        return None
    if layout.dp == 1:
        log.info("shardcore: data_parallel=%r with data_parallel_size=1: nothing to shard or synchronize", mode)
        return None
    mesh = layout.mesh()["dp"]
    from ..expert_parallel import expert_modules

    experts = expert_modules(model)  # split over the expert-parallel ranks: averaged by their own hooks
    if mode == "fsdp":
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import Shard

        dims = policy.data_parallel_shard_dims()
        placement = {id(p): Shard(dims[n]) for n, p in model.named_parameters(remove_duplicate=False) if n in dims}
        kwargs = {"shard_placement_fn": (lambda p: placement.get(id(p)))} if placement else {}
        if experts:
            kwargs["ignored_params"] = {p for m in experts for p in m.parameters()}
        for _, block in policy.blocks():
            fully_shard(block, mesh=mesh, **kwargs)
        fully_shard(model, mesh=mesh, **kwargs)
    else:
        from torch.distributed._composable.replicate import replicate

        replicate(model, process_group=mesh.get_group(), ignored_modules=experts or None)
    log.info("shardcore: %s over %d data-parallel ranks", mode, layout.dp)
    return mode
