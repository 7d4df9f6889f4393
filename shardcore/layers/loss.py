"""Vocab-parallel cross entropy: the loss over vocabulary-split logits, never gathering them.

Rank ``r`` holds logits ``z[..., v]`` for ``v`` in ``[start_r, end_r)``. Forward issues two
all-reduces of per-token scalars: the max (for stability), then the sum of ``exp(z - max)``
together with the target's logit (it lives on exactly one rank). Backward sends nothing: each
rank's gradient is ``softmax(z)[v] - 1[v == target]`` on its own slice.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._functional import all_reduce

__all__ = ["vocab_parallel_cross_entropy"]


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, vocab_start, group, ignore_index):
        ctx.dtype = logits.dtype
        logits = logits.float()
        logits_max = all_reduce(logits.max(dim=-1).values.contiguous(), group, op=dist.ReduceOp.MAX)
        shifted = logits - logits_max.unsqueeze(-1)

        n_local = logits.shape[-1]
        local_target = target - vocab_start
        outside = (local_target < 0) | (local_target >= n_local)
        local_target = local_target.masked_fill(outside, 0)
        target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)

        exp = shifted.exp_()
        sums = torch.stack([exp.sum(dim=-1), target_logit])
        all_reduce(sums, group)
        sum_exp, target_logit = sums[0], sums[1]

        ignored = target == ignore_index
        loss = (sum_exp.log() - target_logit).masked_fill(ignored, 0.0)
        exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(exp, local_target, outside | ignored, ignored)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local_target, not_here, ignored = ctx.saved_tensors
        grad = softmax
        onehot = torch.zeros_like(grad).scatter_(-1, local_target.unsqueeze(-1), 1.0)
        grad.sub_(onehot * (~not_here).unsqueeze(-1))
        grad.mul_((grad_loss * (~ignored)).unsqueeze(-1))
        return grad.to(ctx.dtype), None, None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    vocab_start: int,
    process_group=None,
    ignore_index: int = -100,
    reduction: str = "mean",
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross entropy of vocabulary-split ``logits`` (``[..., n_local]``) against ``target`` (``[...]``).

    ``vocab_start`` is the vocabulary id of this rank's first logit. ``reduction`` is ``"mean"``
    over targets that are not ``ignore_index`` (or a division by ``num_items_in_batch`` when
    given, as in HuggingFace's causal-LM loss), ``"sum"`` or ``"none"``. The result is the same
    on every rank of ``process_group``.
    """
    loss = _VocabParallelCE.apply(logits, target, vocab_start, process_group, ignore_index)
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
