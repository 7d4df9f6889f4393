"""Expert parallelism: ``ShardConfig(expert_parallel_size=E)``.

The ``E`` expert-parallel ranks are carved from the data-parallel ones (Megatron-LM's and
torchtitan's layout, see :class:`~shardcore.ParallelLayout`): each feeds its own part of the
global batch, the dense weights (attention, router, norms, embeddings) stay data-parallel over
all of ``dp`` (DDP or FSDP2, ``data_parallel=``), and each mixture-of-experts layer's experts are
split over the ``E`` ranks (and, inside each, over the tensor-parallel group). A plugin's experts
module marks itself ``expert_parallel = True`` and moves its tokens with :func:`route`: each
token's hidden state travels to the rank holding its chosen expert and back by all-to-all,
dropless (no capacity, no token dropped, the order restored).

Gradients: DDP averages the dense ones over ``dp``. An expert's gradient arrives at its owner,
through the all-to-all's backward, summed over the ``E`` ranks whose tokens chose it;
:func:`install` divides it by ``dp`` and sums it over the ``dp / E`` ranks holding the same
experts, so it is the same mean over the data-parallel ranks DDP takes of the others.

The router's load-balancing loss is each rank's part's (what DDP over the unsharded model gives)
unless ``ShardConfig(global_batch_balance=True)``: then the policy's
:attr:`ExpertSpec.balance <shardcore.spec.ExpertSpec>` computes
it from the routing of the whole global batch (:func:`gather_over`).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from ..attach import attached
from ..distributed.collectives import all_to_all_cat, all_to_all_v, group_size
from ..distributed.scope import backward_of

__all__ = ["check_expert_parallel", "expert_modules", "gather_over", "install", "route"]

_WHERE = "expert dispatch"


def expert_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` whose parameters are split over the expert-parallel ranks."""
    return [m for m in model.modules() if getattr(m, "expert_parallel", False)]


def check_expert_parallel(model: nn.Module, policy, config, layout) -> None:
    """Refuse what ``expert_parallel_size`` / ``global_batch_balance`` cannot run, before any collective."""
    name = type(model).__name__
    if layout.ep > 1 or config.global_batch_balance:
        what = f"expert_parallel_size={layout.ep}" if layout.ep > 1 else "global_batch_balance=True"
        spec = policy.experts()
        if not spec.supported:
            why = spec.refusal or (
                "has no experts to split or route; expert parallelism is for mixture-of-experts models (shard-moe)"
            )
            raise NotImplementedError(
                f"ShardConfig({what}): {type(policy).__name__} ({name}) {why}; leave it at its default"
            )
        if config.global_batch_balance and spec.balance is None:
            raise NotImplementedError(
                f"ShardConfig(global_batch_balance=True): {type(policy).__name__} ({name}) has no router "
                "load-balancing loss to compute over the global batch; leave it False"
            )
        if config.data_parallel is None:
            raise ValueError(
                f"ShardConfig({what}) runs over the data-parallel ranks, whose dense weights must be kept "
                "in step: set data_parallel='ddp' or 'fsdp'"
            )
    if layout.ep > 1 and layout.sp > 1:
        raise NotImplementedError(
            f"ShardConfig(expert_parallel_size={layout.ep}) with sequence_parallel_size={layout.sp} is not built; "
            "use expert and tensor parallelism over data parallelism"
        )


class _AllToAllV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, send, recv, where):
        ctx.group, ctx.send, ctx.recv, ctx.back = group, send, recv, backward_of(f" ({where})")
        return all_to_all_v(x, group, send, recv, where=where)

    @staticmethod
    def backward(ctx, grad):
        return all_to_all_v(grad.contiguous(), ctx.group, ctx.recv, ctx.send, where=ctx.back), None, None, None, None


def route(rows: torch.Tensor, key: torch.Tensor, experts_per_rank: int, group, *, fanout: int = 1):
    """Send rows to the ranks of the group holding their experts and receive the rows other ranks
    send here. ``key`` holds ``fanout`` entries per row (a token's ``top_k`` choices): ``key[i]`` is
    ``rank * experts_per_rank + local expert`` for a copy of row ``i // fanout`` (``group size *
    experts_per_rank``, or more: that copy is not sent).

    Returns ``(received, expert, back)``: the received rows (differentiable), each one's local
    expert (rows from each rank in turn, by expert), and ``back(out)``, which returns the experts'
    outputs for the received rows to the ranks they came from, one row per entry of ``key`` in
    its order, the entries not sent zero. One all-to-all of the counts (their host copy is the one sync a
    dropless dispatch needs: the split sizes), one of the rows there and one back; the backward
    reverses both."""
    world, per = group_size(group), experts_per_rank
    slots = world * per
    order, simulated = torch.argsort(key, stable=True), _simulated(key)
    if simulated:  # a simulated rank (no data): its choices spread evenly over the ranks, then their experts
        each = key.numel() // world
        counts = torch.tensor([each // per + (j < each % per) for j in range(per)] * world, device=key.device)
    else:
        counts = torch.bincount(key.clamp(max=slots), minlength=slots + 1)[:slots]
    got = all_to_all_cat(counts.view(world, per), group, 0, 0, where=_WHERE).reshape(-1)  # rank i's, my experts
    if simulated:
        send = recv = [key.numel() // world] * world
    else:
        send, recv = torch.stack([counts.view(world, per).sum(1), got.view(world, per).sum(1)]).tolist()
    sent = order[: sum(send)]
    received = _AllToAllV.apply(rows[sent // fanout], group, send, recv, _WHERE)
    expert = torch.arange(per, device=key.device).repeat(world).repeat_interleave(got, output_size=sum(recv))

    def back(out: torch.Tensor) -> torch.Tensor:
        returned = _AllToAllV.apply(out, group, recv, send, _WHERE + " (back)")
        whole = returned.new_zeros((key.shape[0], *returned.shape[1:]))
        return whole.index_copy(0, sent, returned)

    return received, expert, back


def _simulated(t: torch.Tensor) -> bool:
    """Whether ``t`` holds no data (``FakeTensorMode``: :mod:`shardcore.cost.tracked`'s simulated rank)."""
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


class _GatherOver(torch.autograd.Function):
    """All-gather along dim 0; backward: the sum over the ranks of the gradients of this rank's rows."""

    @staticmethod
    def forward(ctx, x, group):
        from ..distributed.collectives import all_gather_cat

        ctx.group, ctx.back = group, backward_of(" (global-batch load balancing)")
        return all_gather_cat(x.contiguous(), group, 0, where="global-batch load balancing")

    @staticmethod
    def backward(ctx, grad):
        from ..distributed.collectives import reduce_scatter_cat

        return reduce_scatter_cat(grad.contiguous(), ctx.group, 0, where=ctx.back), None


def gather_over(group):
    """``gather(t)``: ``t`` of every rank of ``group`` concatenated along dim 0, each rank's copy of
    a loss computed from it sending its gradient to every rank's rows (their sum). Equal shapes."""

    def gather(t: torch.Tensor) -> torch.Tensor:
        return _GatherOver.apply(t, group) if group_size(group) > 1 else t

    return gather


def install(model: nn.Module, policy, config, layout) -> None:
    """After data parallelism wrapped ``model``: expert gradients averaged as DDP averages the rest,
    and the global-batch load balancing when asked. Collective (the groups are made)."""
    from ..distributed.collectives import all_reduce

    if config.global_batch_balance and layout.dp > 1:
        policy.experts().balance(gather_over(layout.group("dp")))  # declared: check_expert_parallel
    if layout.ep == 1:
        return
    _synced_generate(model)
    _, _, replicas = layout.expert_groups()
    dp = layout.dp

    def average(grad: torch.Tensor) -> torch.Tensor:
        grad = grad / dp
        return all_reduce(grad, replicas, where="backward of the experts (gradient summed over their replicas)")

    for module in expert_modules(model):
        for param in module.parameters(recurse=False):
            if param.requires_grad:
                param.register_hook(average)


def _synced_generate(model: nn.Module) -> None:
    """Each expert-parallel rank generates for its own prompts, and every forward is a collective
    (the all-to-alls): a rank whose sequences are done keeps stepping until every rank is
    (transformers' ``synced_gpus``, made the default here; ``synced_gpus=False`` is refused)."""
    if getattr(model, "generate", None) is None:
        return

    def synced_gpus(generate):
        @functools.wraps(generate)
        def synced(*args, **kwargs):
            if kwargs.get("synced_gpus") is False:
                raise ValueError(
                    "generate(synced_gpus=False) under expert parallelism: every rank's forward moves tokens to "
                    "the others' experts, so a rank that stops early leaves the others waiting; leave synced_gpus out"
                )
            kwargs["synced_gpus"] = True
            return generate(*args, **kwargs)

        return synced

    attached(model).route(model, "generate", "synced_gpus", synced_gpus, what="every rank steps until all are done")
