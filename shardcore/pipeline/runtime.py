"""Running a pipelined model: one training step over microbatches, forward-only calls, tied tensors."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..amp import agree_on_overflow, fp16_in_play
from ..data_parallel import dp_local
from ..distributed.collectives import all_reduce, broadcast, group_device
from ..distributed.objects import broadcast_object, recv, recv_object, send, send_object
from .check import PipelineInfo, _stage_indices
from .schedule import _is_single, _schedule_class
from .simulated import check_simulated_shapes

#: what a forward-only pipeline's transfers say they are, in a time-out or an audit
_WHERE = "the forward-only pipeline's activations"


def _send(tensors: tuple, peer: int, group) -> None:
    send_object([(tuple(t.shape), t.dtype) for t in tensors], peer, group, where=_WHERE)
    for t in tensors:
        send(t, peer, group, where=_WHERE)


def _recv(peer: int, group) -> tuple:
    meta = recv_object(peer, group, where=_WHERE)
    device = group_device(group)
    return tuple(
        recv(torch.empty(shape, dtype=dtype, device=device), peer, group, where=_WHERE) for shape, dtype in meta
    )


def _forward_only(model: nn.Module, info: PipelineInfo, args: tuple, kwargs: dict):
    """The whole batch through the stages in order; the last stage's output broadcast to every rank."""
    names = list(inspect.signature(model.forward).parameters)
    batch = {**dict(zip(names, args, strict=False)), **{k: v for k, v in kwargs.items() if v is not None}}
    logits_to_keep = batch.pop("logits_to_keep", 0)
    inputs, labels = info.spec.inputs(batch, training=False)
    me = dist.get_group_rank(info.group, dist.get_rank())
    pp = dist.get_world_size(info.group)
    per_rank = len(info.stage_indices)
    owner = [_stage_owner(s, pp, per_rank, info.schedule_name) for s in range(info.num_stages)]
    stages = dict(zip(info.stage_indices, (st.submod for st in info.stages), strict=True))
    x = inputs
    with torch.no_grad():
        for s in range(info.num_stages):
            if owner[s] != me:
                continue
            if s > 0 and owner[s - 1] != me:
                x = _recv(owner[s - 1], info.group)
            out = stages[s](*x)
            x = out if isinstance(out, tuple) else (out,)
            if s < info.num_stages - 1 and owner[s + 1] != me:
                _send(x, owner[s + 1], info.group)
        x = tuple(t.contiguous() for t in x)  # a collective sends memory as it lies (logits may be a narrowed view)
        meta = [(tuple(t.shape), t.dtype) for t in x] if owner[-1] == me else None
        meta = broadcast_object(meta, owner[-1], info.group, where=_WHERE)
        if owner[-1] != me:
            x = tuple(torch.empty(shape, dtype=dtype, device=group_device(info.group)) for shape, dtype in meta)
        for t in x:
            broadcast(t, info.group, where=_WHERE, src=owner[-1])
        logits = x[0]
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            logits = logits[:, -logits_to_keep:]
        loss = None
        if labels is not None:
            loss = info.spec.loss(x[0] if len(x) == 1 else x, labels, info.spec.num_items(labels))
    return info.spec.output(logits, loss, *x[1:])  # the last stage's further outputs, if any


def _stage_owner(stage: int, pp: int, per_rank: int, name: str) -> int:
    """The pp rank running ``stage``."""
    for r in range(pp):
        if stage in _stage_indices(r, pp, per_rank, name):
            return r
    raise AssertionError(f"stage {stage} has no rank")


def _make_schedule(info: PipelineInfo, loss_fn):
    cls = _schedule_class(info.schedule_name)
    stage = info.stages[0] if _is_single(info.schedule_name) else info.stages
    kwargs: dict[str, Any] = {"loss_fn": loss_fn}
    if "scale_grads" in inspect.signature(cls.__init__).parameters:
        kwargs["scale_grads"] = False  # each microbatch's loss is already weighed by the whole batch's terms
    return cls(stage, info.num_microbatches, **kwargs)


def pipeline_step(model: nn.Module, batch: Mapping[str, Any], *, loss_scale=None) -> torch.Tensor:
    """One training step's forward and backward over the whole ``batch`` (as the unsharded model
    would take it, labels included); the gradients are left accumulated in the parameters this
    rank holds, and the loss of the whole batch is returned on every rank.

    Under pipeline parallelism the batch is cut into ``num_microbatches`` microbatches run by the
    configured schedule; each microbatch's loss is weighed by the whole batch's number of loss
    terms, so the result equals the unsharded model's loss also when microbatches hold different
    numbers of label tokens. Without pipeline parallelism: ``model(**batch).loss.backward()``.

    ``loss_scale``: what multiplies each loss before its backward, for fp16 loss scaling: the user's
    ``torch.amp.GradScaler``'s ``scaler.scale`` (then ``scaler.step(optimizer)``, ``scaler.update()``
    as usual; an overflow on any rank skips the step on every rank, see :mod:`shardcore.amp`). It is
    called on every rank, with a zero on ranks whose stages compute no loss (so a scaler that starts
    lazily starts there too). The returned loss is unscaled.
    """
    info = getattr(getattr(model, "shardcore", None), "pipeline", None)
    if info is None:
        out = model(**batch)
        loss = out["loss"] if isinstance(out, Mapping) else out.loss
        (loss if loss_scale is None else loss_scale(loss)).backward()
        return loss.detach()
    if model.shardcore.config.inference_only:
        raise RuntimeError(
            f"{type(model).__name__} was sharded with ShardConfig(inference_only=True): its parameters are frozen; "
            "run model(**batch) for inference, or shard it without inference_only to train it"
        )
    args, labels = info.spec.inputs(dict(batch))  # local checks first: the same on every rank
    if labels is None:
        raise ValueError("pipeline_step: the batch has no labels; a training step needs them")
    size = args[0].shape[0]
    if size % info.num_microbatches:
        raise ValueError(
            f"pipeline_step: batch size {size} is not divisible by num_microbatches={info.num_microbatches}; "
            "give a batch whose size is a multiple of it (or change num_microbatches)"
        )
    _check_same_batch(model, info, batch)
    info.num_items = info.spec.num_items(labels)
    shapes = tuple(tuple(a.shape) for a in args)
    check_simulated_shapes(info, shapes)
    device = next(model.parameters()).device
    if (info.shapes is not None and info.shapes != shapes) or info.stages[0].device != device:
        # torch's stages keep the shapes of their first step and the device they were built on (meta,
        # for a model built under init_empty and loaded since): new shapes or device, new stages
        info.rebuild()
    info.shapes = shapes
    losses: list[torch.Tensor] = []
    info.loss_scale, info.unscaled = loss_scale, []
    if info.is_first:
        info.schedule.step(*args, target=labels, losses=losses, return_outputs=False)
    else:
        info.schedule.step(target=labels, losses=losses, return_outputs=False)
    _after_step(model, info)
    if loss_scale is not None and not info.unscaled:  # a rank without the loss: its scaler starts here too
        loss_scale(torch.zeros((), device=device))
    losses = info.unscaled if loss_scale is not None else losses
    total = torch.stack([x.detach().float() for x in losses]).sum() if losses else _zero(info.group)
    broadcast(total, info.group, where="the pipeline's loss", src=info.last_stage_rank)
    return total


def _check_same_batch(model: nn.Module, info: PipelineInfo, batch: Mapping[str, Any]) -> None:
    """Every rank of a pipeline (and of its TP and sequence-parallel groups) gets the same batch (``check_inputs``)."""
    check = model.shardcore.config.check_inputs
    if not check:
        return
    from ..consistency import InputGate

    layout = model.shardcore.layout
    for dim in ("pp", "tp", "sp"):
        if layout.degrees[dim] > 1:
            gate = info.input_gates.setdefault(dim, InputGate(check == "always"))
            gate.check(layout.group(dim), "pipeline_step", (), dict(batch))


def _after_step(model: nn.Module, info: PipelineInfo) -> None:
    """Tied parameters' gradients summed over their stages; under fp16 an overflow anywhere agreed on."""
    for name, group in info.tied:  # the input and output embeddings: one parameter, two stages
        param = model.get_parameter(name)
        if param.grad is not None:  # under FSDP the stages' data-parallel shards of it line up: sum those
            all_reduce(dp_local(param.grad), group, where="pipeline_step: a tied parameter's gradient")
    if fp16_in_play(model, model.shardcore.config):  # an overflow on any stage or rank skips the step everywhere
        agree_on_overflow(model.parameters(), dist.group.WORLD)
    for hook in info.after_step:
        hook(model)


def _zero(group) -> torch.Tensor:
    """A stage without the loss receives it into this (on the device the group needs)."""
    return torch.zeros((), device=group_device(group))


def tensor_aliases(model: nn.Module) -> dict[str, list[str]]:
    """The other names of each tied parameter of a pipelined model (``{}`` without a pipeline)."""
    info = getattr(getattr(model, "shardcore", None), "pipeline", None)
    return dict(info.aliases) if info is not None else {}
