"""The LM head and its cross entropy in one, chunk by chunk: the logits are never whole.

A causal LM's logits are its largest activation (``tokens x vocabulary``: 4096 x 128256 in
float32 is 2 GiB per sequence, kept for the backward). :func:`vocab_parallel_linear_cross_entropy`
computes ``cross_entropy(hidden @ W^T + b, target)`` a chunk of tokens at a time: each chunk's
logits live only while its statistics (max, sum of exponentials, the target's logit) are taken,
and the backward computes them again, chunk by chunk, for the gradients of the hidden states, the
weight and the bias. Under tensor parallelism ``W`` is this rank's vocabulary rows (a
:class:`~shardcore.tensor_parallel.embedding.VocabParallelLMHead1D`): one all-gather of the
per-token statistics in the forward, as :func:`~shardcore.tensor_parallel.loss.vocab_parallel_cross_entropy`
does, and the hidden states' gradient summed over the group in the backward (Megatron's ``f``).
What it saves for the backward: the hidden states it was given (the model holds them anyway),
and two floats a token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .loss import combine
from .mappings import copy_to_tp

__all__ = ["vocab_parallel_linear_cross_entropy"]


def _stats(z: torch.Tensor, local_target: torch.Tensor, here: torch.Tensor) -> torch.Tensor:
    """``[3, tokens]``: each token's max logit, sum of exponentials below it and target logit (0 off this rank)."""
    if not z.shape[-1]:  # this rank holds only vocabulary padding
        zero = z.new_zeros(z.shape[:-1])
        return torch.stack([zero - float("inf"), zero, zero])
    top = z.amax(dim=-1)
    sums = (z - top.unsqueeze(-1)).exp().sum(dim=-1)
    target = z.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(~here, 0.0)
    return torch.stack([top, sums, target])


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, target, vocab_start, group, ignore_index, chunk):
        n_local = weight.shape[0]
        local_target = target - vocab_start
        here = (local_target >= 0) & (local_target < n_local)
        local_target = local_target.masked_fill(~here, 0)
        stats = torch.cat(
            [
                _stats(
                    F.linear(hidden[s : s + chunk], weight, bias).float(),
                    local_target[s : s + chunk],
                    here[s : s + chunk],
                )
                for s in range(0, hidden.shape[0], chunk)
            ],
            dim=1,
        )
        loss, top, total, kept = combine(stats, group, target, ignore_index)  # one all-gather, as the plain loss
        ctx.save_for_backward(hidden, weight, bias, local_target, here & kept, kept, top, total)
        ctx.chunk = chunk
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        hidden, weight, bias, local_target, target_here, kept, top, total = ctx.saved_tensors
        grad_hidden = torch.zeros_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if bias is not None else None
        scale = grad_loss * kept
        for s in range(0, hidden.shape[0], ctx.chunk):
            e = s + ctx.chunk
            x = hidden[s:e]
            # d loss / d z_v = softmax_v - [v == target], computed again for this chunk only
            p = (F.linear(x, weight, bias).float() - top[s:e].unsqueeze(-1)).exp_().div_(total[s:e].unsqueeze(-1))
            if p.shape[-1]:
                p.scatter_add_(-1, local_target[s:e].unsqueeze(-1), -target_here[s:e].unsqueeze(-1).to(p.dtype))
            p.mul_(scale[s:e].unsqueeze(-1))
            grad_hidden[s:e] = (p.to(weight.dtype) @ weight).to(hidden.dtype)
            grad_weight.addmm_(p.t(), x.float())
            if grad_bias is not None:
                grad_bias += p.sum(dim=0)
        grad_bias = grad_bias.to(bias.dtype) if grad_bias is not None else None
        return grad_hidden, grad_weight.to(weight.dtype), grad_bias, None, None, None, None, None


def vocab_parallel_linear_cross_entropy(
    hidden: torch.Tensor,
    head: nn.Module,
    target: torch.Tensor,
    *,
    chunk_tokens: int = 1024,
    ignore_index: int = -100,
    reduction: str = "mean",
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """``cross_entropy(head(hidden), target)`` without the logits (see the module): ``hidden``
    ``[tokens, hidden]``, ``target`` ``[tokens]``; ``head`` the model's LM head, a sharded model's
    :class:`~shardcore.tensor_parallel.embedding.VocabParallelLMHead1D` or an unsharded ``nn.Linear``.
    ``chunk_tokens`` tokens' logits at a time (``chunk_tokens x vocabulary / tp`` floats). The
    reductions are :func:`~shardcore.tensor_parallel.loss.vocab_parallel_cross_entropy`'s; the result
    is the same on every rank of the group, the unsharded loss.

    A causal LM's loss from its base model's output::

        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        loss = vocab_parallel_linear_cross_entropy(hidden[:, :-1].flatten(0, 1), model.lm_head, labels[:, 1:].flatten())
    """
    if hidden.dim() != 2 or target.shape != hidden.shape[:1]:
        raise ValueError(
            f"vocab_parallel_linear_cross_entropy: hidden [tokens, hidden] and target [tokens], got "
            f"{tuple(hidden.shape)} and {tuple(target.shape)}; flatten the batch and sequence dims first"
        )
    if chunk_tokens < 1:
        raise ValueError(f"vocab_parallel_linear_cross_entropy: chunk_tokens must be at least 1, got {chunk_tokens}")
    group = getattr(head, "process_group", None)
    start = getattr(head, "vocab_start", 0)
    n_local = getattr(head, "vocab_end", head.weight.shape[0]) - start  # the padding rows have no logit
    weight = head.weight[:n_local]
    bias = head.bias[:n_local] if getattr(head, "bias", None) is not None else None
    if group is not None:
        hidden = copy_to_tp(hidden, group)  # every rank's vocabulary slice reads it: gradients summed
    loss = _LinearCrossEntropy.apply(hidden, weight, bias, target, start, group, ignore_index, chunk_tokens)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction != "mean":
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return loss.sum() / (num_items_in_batch if num_items_in_batch is not None else (target != ignore_index).sum())
