"""Summed losses for :meth:`shardcore.Policy.pipeline_loss`: a microbatch's loss summed over its
terms (divided by the whole batch's count, the microbatches add up to the whole batch's mean),
with the reductions HuggingFace's heads use, so a pipelined model's loss is the unsharded one's.

* :func:`token_loss`: cross-entropy over label tokens, ``-100`` ignored (masked LM, seq2seq).
* :func:`classification_loss`: sequence / image classification by the config's ``problem_type``
  (regression, single- or multi-label), as transformers decides it when the config leaves it unset.

And :func:`causal_lm_loss_on_slices`: a causal LM's loss on each rank's vocabulary slice. How a
HuggingFace ``*ForCausalLM`` is made to compute its loss that way (its ``loss_function``) is HF glue:
:mod:`shardcore.integrations.hf.causal_lm_loss` (the old names here still work, warned).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .moved import moved_names

__all__ = [
    "causal_lm_loss_on_slices",
    "classification_items",
    "classification_loss",
    "classification_problem",
    "token_items",
    "token_loss",
]

#: Moved to :mod:`shardcore.integrations.hf.causal_lm_loss` (0.2): resolved from there, warned.
_MOVED = ("defer_logits_gather", "loss_on_head_slices")


__getattr__ = moved_names(__name__, "shardcore.integrations.hf.causal_lm_loss", _MOVED)


def token_items(labels: torch.Tensor) -> torch.Tensor:
    """The label tokens a token-level loss averages over (``-100`` ignored)."""
    return (labels != -100).sum()


def token_loss(logits: torch.Tensor, labels: torch.Tensor, num_items) -> torch.Tensor:
    """Cross-entropy summed over this microbatch's label tokens, divided by ``num_items``."""
    summed = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum")
    return summed / num_items


def classification_problem(config, labels: torch.Tensor) -> str:
    """``config.problem_type``, or what transformers infers when it is unset."""
    if getattr(config, "problem_type", None):
        return config.problem_type
    if config.num_labels == 1:
        return "regression"
    integer = labels.dtype in (torch.long, torch.int)
    return "single_label_classification" if integer else "multi_label_classification"


def classification_items(config, labels: torch.Tensor) -> int:
    """The terms a classification loss averages over: one per example (per label, multi-label)."""
    if classification_problem(config, labels) == "multi_label_classification":
        return labels.numel()
    return labels.shape[0]


def classification_loss(config, logits: torch.Tensor, labels: torch.Tensor, num_items) -> torch.Tensor:
    """The classification loss summed over this microbatch, divided by ``num_items``."""
    problem, num_labels = classification_problem(config, labels), config.num_labels
    if problem == "single_label_classification":
        loss = F.cross_entropy(logits.reshape(-1, num_labels), labels.reshape(-1), reduction="sum")
    elif problem == "regression":
        pair = (logits.squeeze(), labels.squeeze()) if num_labels == 1 else (logits, labels)
        loss = F.mse_loss(*pair, reduction="sum")
    else:
        loss = F.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
    return loss / num_items


def causal_lm_loss_on_slices(
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    head,
    *,
    ignore_index: int = -100,
    num_items_in_batch=None,
    shift_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """HuggingFace's causal-LM loss (labels shifted left by one, ``ignore_index``,
    ``num_items_in_batch``) over this rank's vocabulary slice of a
    :class:`~shardcore.tensor_parallel.VocabParallelLMHead1D` ``head``'s logits: the vocab-parallel cross entropy."""
    from .tensor_parallel import vocab_parallel_cross_entropy

    if shift_labels is None:  # tokens < n predict n
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    return vocab_parallel_cross_entropy(
        logits.float(),
        shift_labels.to(logits.device),
        vocab_start=head.vocab_start,
        process_group=head.process_group,
        ignore_index=ignore_index,
        num_items_in_batch=num_items_in_batch,
    )
