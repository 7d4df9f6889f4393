"""fp16 loss scaling that decides as the unsharded model would: an overflow anywhere skips the step everywhere.

``torch.amp.GradScaler`` decides "overflow, skip this step and halve the scale" from the gradients the
optimizer holds. On a sharded model each rank holds slices: an inf in rank 1's slice of a gradient
is seen by rank 1 only, which skips, while rank 0 steps, and from then on the ranks hold different
weights and scales without a word (the trap ColossalAI, fairseq2 and NeMo each fixed).

shardcore makes the user's own scaler lines right instead of asking for another scaler: at the end
of every backward in which fp16 is in play (the forward ran under ``torch.autocast`` in float16, a
parameter is float16, or ``ShardConfig(mixed_precision="fp16")``), every rank of the model's world
checks its gradients for a non-finite value (one fused read), the ranks agree by one all-reduce of
one flag, and when any rank found one, every rank writes a NaN into one entry of each of its
gradients: each rank's ``GradScaler`` then sees the overflow, skips the step and moves its scale,
as the unsharded model's would. No host sync (the flag stays on the device); nothing is done
without fp16. Under pipeline parallelism :func:`shardcore.pipeline_step` agrees once per step,
after the last microbatch's backward.

The end of the backward is found from the model's outputs (a gradient hook on each); the check is
queued from a callback, so it runs after every end-of-backward callback queued during the backward
(DDP's and FSDP's reductions): the reduced gradients are the ones checked and poisoned.
"""

from __future__ import annotations

import torch
from torch import nn

from .attach import attached
from .attach.stage import in_stage
from .data_parallel import dp_local
from .distributed.collectives import all_reduce, group_device, group_size

__all__ = ["agree_on_overflow", "fp16_in_play", "install_overflow_agreement"]

_WHERE = "fp16 overflow agreement (end of backward): every rank of the model runs the backward"


def agree_on_overflow(parameters, group) -> torch.Tensor:
    """Make every rank of ``group`` see an overflow when any rank's gradient of ``parameters`` holds a
    non-finite value (a NaN written into one entry of each local gradient); returns the agreed flag
    (a 0-d float tensor, 1.0 when some rank overflowed). One all-reduce, no host sync."""
    grads = [g for g in (dp_local(p.grad) for p in parameters if p.grad is not None) if g.numel()]
    device = grads[0].device if grads else group_device(group)
    flag = torch.zeros((), dtype=torch.float32, device=device)
    by_dtype: dict = {}
    for g in grads:
        by_dtype.setdefault((g.device, g.dtype), []).append(g)
    for same in by_dtype.values():
        norms = torch._foreach_norm(same, float("inf"))  # NaN and inf both survive the max
        found = (~torch.stack(norms).float().isfinite()).any().float()
        flag = torch.maximum(flag, found.to(device, non_blocking=True))
    wire = group_device(group)
    shared = flag.to(wire, non_blocking=True) if wire != flag.device else flag
    all_reduce(shared, group, op=torch.distributed.ReduceOp.MAX, where=_WHERE)
    flag = shared.to(device, non_blocking=True) if shared is not flag else shared
    if grads:
        poison = torch.where(flag > 0, float("nan"), 0.0)
        for (dev, dtype), same in by_dtype.items():
            torch._foreach_add_([g.view(-1)[:1] for g in same], poison.to(dev, dtype, non_blocking=True))
    return flag


def fp16_in_play(model: nn.Module, config) -> bool:
    """Whether this forward computes in float16: autocast to it on the parameters' device, parameters
    in float16, or FSDP's mixed precision in it (the same answer on every rank of an SPMD job)."""
    if getattr(config, "mixed_precision", None) == "fp16":
        return True
    param = next(model.parameters(), None)
    if param is None:
        return False
    kind = param.device.type
    if torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) == torch.float16:
        return True
    return param.dtype == torch.float16  # a model in fp16 (model.half()): its first parameter says it, per forward


def install_overflow_agreement(model: nn.Module, group, config) -> None:
    """Arm :func:`agree_on_overflow` over ``group`` for every backward of ``model`` whose forward ran
    with fp16 in play (see the module docstring)."""
    if group is None or group_size(group) == 1:
        return
    state = {"queued": False}

    def agree() -> None:
        state["queued"] = False
        agree_on_overflow(model.parameters(), group)

    def last() -> None:  # queued from a callback: it runs after every end-of-backward callback queued
        torch.autograd.Variable._execution_engine.queue_callback(agree)  # so far (DDP's, FSDP's reductions)

    def on_grad(grad):
        if not state["queued"]:
            state["queued"] = True
            torch.autograd.Variable._execution_engine.queue_callback(last)
        return grad

    def hook(module, args, output):
        if in_stage(module) or not torch.is_grad_enabled():
            return  # a pipeline stage: pipeline_step agrees once per step
        if not fp16_in_play(module, config):
            return
        for t in _tensors(output):
            if t.requires_grad:
                t.register_hook(on_grad)

    attached(model).after_forward(model, "overflow_agreement", hook, what="fp16 overflow agreed in the backward")


def _tensors(output) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _tensors(item)]
    return []
