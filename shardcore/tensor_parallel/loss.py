"""Vocab-parallel cross entropy: the loss over vocabulary-split logits, never gathering them.

Rank ``r`` holds logits ``z[..., v]`` for ``v`` in ``[start_r, end_r)``. Forward issues ONE
collective, an all-gather of three per-token scalars per rank: the local max ``m_r``, the local
sum ``s_r = sum_v exp(z_v - m_r)`` and the target's logit (it lives on exactly one rank). Every
rank then combines them: ``M = max_r m_r``, ``S = sum_r s_r exp(m_r - M)``, and
``loss = log S + M - z_target``. Backward sends nothing: each rank's gradient is
``softmax(z)_v - [v == target]`` on its own slice.
"""

from __future__ import annotations

import torch

from ..distributed.collectives import all_gather_cat, group_size
from .vocab_slice import plain, slice_of

__all__ = ["vocab_parallel_cross_entropy"]


def combine(stats: torch.Tensor, group, target: torch.Tensor, ignore_index: int) -> tuple:
    """Every rank's ``[3, ...]`` statistics of its vocabulary slice (local max, sum of exponentials
    below it, the target's logit or 0), all-gathered (one collective) and combined: ``(loss per
    target, global max, sum of exponentials below it, which targets count)``."""
    stats = stats.unsqueeze(0)
    if group is not None and group_size(group) > 1:
        stats = all_gather_cat(stats, group, dim=0)  # [tp, 3, ...]
    maxes, sums = stats[:, 0], stats[:, 1]
    global_max = maxes.amax(dim=0)
    sum_exp = (sums * (maxes - global_max).exp()).sum(dim=0)
    kept = target != ignore_index
    loss = (sum_exp.log() + global_max - stats[:, 2].sum(dim=0)).masked_fill(~kept, 0.0)
    return loss, global_max, sum_exp, kept


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, vocab_start, group, ignore_index):
        ctx.dtype = logits.dtype
        logits = logits.float()
        n_local = logits.shape[-1]
        if n_local:
            local_max = logits.amax(dim=-1)
        else:  # this rank holds only vocabulary padding
            local_max = logits.new_full(logits.shape[:-1], float("-inf"))
        exp = logits - local_max.unsqueeze(-1)

        local_target = target - vocab_start
        here = (local_target >= 0) & (local_target < n_local)
        local_target = local_target.masked_fill(~here, 0).unsqueeze(-1)
        if n_local:
            target_logit = (exp.gather(-1, local_target).squeeze(-1) + local_max).masked_fill(~here, 0.0)
        else:
            target_logit = torch.zeros_like(local_max)

        exp.exp_()
        stats = torch.stack([local_max, exp.sum(dim=-1), target_logit])
        loss, global_max, sum_exp, kept = combine(stats, group, target, ignore_index)
        exp.mul_(((local_max - global_max).exp() / sum_exp).unsqueeze(-1))  # now the softmax, kept for backward
        ctx.save_for_backward(exp, local_target, (here & kept).unsqueeze(-1), kept)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        # d loss / d z_v = softmax_v - [v == target]; the softmax buffer is reused in place
        softmax, local_target, target_here, kept = ctx.saved_tensors
        grad = softmax
        if grad.shape[-1]:
            grad.scatter_add_(-1, local_target, -target_here.to(grad.dtype))
        grad.mul_((grad_loss * kept).unsqueeze(-1))
        return grad.to(ctx.dtype), None, None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    vocab_start: int | None = None,
    process_group=None,
    ignore_index: int = -100,
    reduction: str = "mean",
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross entropy of vocabulary-split ``logits`` (``[..., n_local]``) against ``target`` (``[...]``).

    ``logits`` as a sharded model returns them with ``ShardConfig(parallel_output=True)`` (a
    :class:`~shardcore.tensor_parallel.vocab_slice.VocabSlice`) carry their vocabulary offset and
    group: ``vocab_parallel_cross_entropy(logits, targets)`` is then all it takes, e.g.
    ``vocab_parallel_cross_entropy(logits.flatten(0, 1), targets.flatten())``. Otherwise
    ``vocab_start`` is the vocabulary id of this rank's first logit and ``process_group`` the group
    the vocabulary is split over. ``reduction`` is ``"mean"`` over targets that are not
    ``ignore_index`` (or a division by ``num_items_in_batch`` when given, as in HuggingFace's
    causal-LM loss), ``"sum"`` or ``"none"``. The result is the same on every rank of the group:
    the unsharded ``F.cross_entropy`` of the whole logits.
    """
    mark = slice_of(logits)
    if mark is not None:
        vocab_start = mark[0] if vocab_start is None else vocab_start
        process_group = mark[2] if process_group is None else process_group
    if vocab_start is None:
        raise TypeError(
            "vocab_parallel_cross_entropy: these logits carry no vocabulary slice (they are not what a model "
            "sharded with ShardConfig(parallel_output=True) returned); pass vocab_start= and process_group="
        )
    loss = _VocabParallelCE.apply(plain(logits), plain(target), vocab_start, process_group, ignore_index)
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "sum":
        return total
    if reduction != "mean":
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if num_items_in_batch is not None:
        return total / num_items_in_batch
    return total / (target != ignore_index).sum()
