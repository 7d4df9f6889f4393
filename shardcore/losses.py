"""Summed losses for :meth:`shardcore.Policy.pipeline_loss`: a microbatch's loss summed over its
terms (divided by the whole batch's count, the microbatches add up to the whole batch's mean),
with the reductions HuggingFace's heads use, so a pipelined model's loss is the unsharded one's.

* :func:`token_loss`: cross-entropy over label tokens, ``-100`` ignored (masked LM, seq2seq).
* :func:`classification_loss`: sequence / image classification by the config's ``problem_type``
  (regression, single- or multi-label), as transformers decides it when the config leaves it unset.

And :func:`defer_logits_gather`: a causal LM's loss on each rank's vocabulary slice while its
full logits are gathered.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

__all__ = [
    "causal_lm_loss_on_slices",
    "classification_items",
    "classification_loss",
    "classification_problem",
    "defer_logits_gather",
    "token_items",
    "token_loss",
]


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


def loss_on_head_slices(model, head) -> None:
    """``ShardConfig(parallel_output=True)`` on a HuggingFace ``*ForCausalLM``: its own forward runs,
    its vocab-parallel ``head`` returns this rank's vocabulary slice of the logits, and the causal-LM
    loss the forward asks its ``loss_function`` for is the vocab-parallel cross entropy of that
    slice (:func:`causal_lm_loss_on_slices`): no rank ever holds the full logits."""

    head.loss_on_slices = True
    model.loss_function = _loss_on_slices_of(head)


def _loss_on_slices_of(head):
    """HF's ``loss_function`` signature over :func:`causal_lm_loss_on_slices` of ``head``'s slice."""

    def loss_function(
        logits, labels, vocab_size=None, num_items_in_batch=None, ignore_index=-100, shift_labels=None, **kwargs
    ):
        return causal_lm_loss_on_slices(
            logits,
            labels,
            head,
            ignore_index=ignore_index,
            num_items_in_batch=num_items_in_batch,
            shift_labels=shift_labels,
        )

    return loss_function


def defer_logits_gather(model, head) -> bool:
    """A HuggingFace ``*ForCausalLM`` whose vocab-parallel ``head`` (a
    :class:`~shardcore.tensor_parallel.VocabParallelLMHead1D` gathering full logits): during the model's
    forward, the head leaves its all-gather running and the model's causal-LM loss (its
    ``loss_function``, HF's ``ForCausalLMLoss``) is the vocab-parallel cross entropy of this rank's
    slice, computed meanwhile; the full-vocabulary softmax and its gradient are never formed. The
    output then holds the gathered logits, as without this. The model's own forward runs unchanged.

    Only over transformers' own causal-LM loss: a model whose ``loss_function`` is another (a
    masked LM's, or one the user set), or whose ``head`` is not a vocab-parallel head gathering
    full logits (``None``, a pipeline hole, ``parallel_output=True``), is left as it is, and
    ``False`` returned.
    """
    from .tensor_parallel import VocabParallelLMHead1D

    causal_lm_loss = getattr(model, "loss_function", None)
    if not (isinstance(head, VocabParallelLMHead1D) and head.gather_output):
        return False
    if getattr(causal_lm_loss, "__name__", None) != "ForCausalLMLoss" or not _forward_calls_loss_function(model):
        return False

    on_slices = _loss_on_slices_of(head)

    def loss_function(logits, labels, vocab_size, **kwargs):
        local = head.pending_logits
        if local is None or logits.shape != local.shape:  # full logits (pipeline stages): the model's own
            return causal_lm_loss(logits=logits, labels=labels, vocab_size=vocab_size, **kwargs)
        return on_slices(logits, labels, vocab_size, **kwargs)

    original = model.forward

    @functools.wraps(original)  # generate() inspects the signature
    def forward(*args, **kwargs):
        head.defer_gather = True
        try:
            output = original(*args, **kwargs)
        except BaseException:
            head.drop_gather()
            raise
        finally:
            head.defer_gather = False
        local = head.pending_logits
        if local is None:  # the head did not run (a pipeline stage before the last)
            return output
        return _put_full_logits(model, head, output, local, head.finish_gather())

    head.loss_on_slices = True
    model.loss_function = loss_function
    model.forward = forward
    return True


def _forward_calls_loss_function(model) -> bool:
    """Whether the model's forward computes its loss by ``self.loss_function`` (some compute their own
    cross entropy on the logits, which must then be the gathered ones)."""
    import inspect

    try:
        return "self.loss_function(" in inspect.getsource(type(model).forward)
    except (OSError, TypeError):
        return False


def _put_full_logits(model, head, output, local: torch.Tensor, full: torch.Tensor):
    """``output`` with the gathered ``full`` logits in place of the logits its forward returned
    (found by key, or by position and the slice's shape)."""
    if isinstance(output, tuple):  # return_dict=False: (loss,) logits, ...
        at = next((i for i, v in enumerate(output) if isinstance(v, torch.Tensor) and v.shape == local.shape), None)
        value = None if at is None else output[at]
    else:
        at, value = "logits", output.get("logits")
        if not (isinstance(value, torch.Tensor) and value.shape == local.shape):
            value = None
    if value is None:
        raise RuntimeError(
            f"{type(model).__name__}: its forward returned no logits of its head's shape {tuple(local.shape)}, "
            "so shardcore cannot put the gathered full-vocabulary logits in their place; shard with "
            "ShardConfig(parallel_output=True) to get the vocabulary slices"
        )
    same = value.data_ptr() == local.data_ptr() and value.stride() == local.stride()  # (a hook's alias)
    if not same:  # the model changed its head's logits (a scale, a soft cap): gather what it returns
        full = head.gather_slices(value)
    if isinstance(output, tuple):
        return (*output[:at], full, *output[at + 1 :])
    output[at] = full
    return output
