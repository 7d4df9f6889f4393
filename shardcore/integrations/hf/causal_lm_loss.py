"""A HuggingFace ``*ForCausalLM``'s loss on each rank's vocabulary slice: its own forward runs, and the
causal-LM loss it asks its ``loss_function`` for (transformers' ``ForCausalLMLoss``) becomes the
vocab-parallel cross entropy (:func:`shardcore.losses.causal_lm_loss_on_slices`).

* :func:`loss_on_head_slices`: ``ShardConfig(parallel_output=True)``: the logits stay split;
* :func:`defer_logits_gather`: the full logits are gathered while the loss is computed on the slices.

transformers' glue, so it lives here; policies call it (shard-llama's, plans' derived policies).
"""

from __future__ import annotations

import functools

import torch

from ...attach import attached
from ...losses import causal_lm_loss_on_slices
from ...tensor_parallel.regions import storage_key

__all__ = ["defer_logits_gather", "loss_on_head_slices", "loss_on_slices_where_causal_lm"]


def loss_on_head_slices(model, head) -> None:
    """``ShardConfig(parallel_output=True)`` on a HuggingFace ``*ForCausalLM``: its own forward runs,
    its vocab-parallel ``head`` returns this rank's vocabulary slice of the logits, and the causal-LM
    loss the forward asks its ``loss_function`` for is the vocab-parallel cross entropy of that
    slice (:func:`causal_lm_loss_on_slices`): no rank ever holds the full logits."""

    head.loss_on_slices = True
    on_slices = _loss_on_slices_of(head)
    attached(model).route(
        model, "loss_function", "vocab_parallel", lambda inner: on_slices, what="cross entropy on the slices"
    )


def loss_on_slices_where_causal_lm(model, head) -> bool:
    """``parallel_output=True`` on a model shardcore did not write a policy for: :func:`loss_on_head_slices`
    where the model is a HuggingFace causal LM whose forward asks its ``loss_function`` (transformers'
    ``ForCausalLMLoss``) for the loss and ``head`` is a vocab-parallel head; ``False`` otherwise (a
    model computing its own loss on the slice meets the slice's refusal, :mod:`shardcore.tensor_parallel.vocab_slice`)."""
    from ...tensor_parallel import VocabParallelLMHead1D

    causal_lm_loss = getattr(model, "loss_function", None)
    if not isinstance(head, VocabParallelLMHead1D) or getattr(causal_lm_loss, "__name__", None) != "ForCausalLMLoss":
        return False
    if not _forward_calls_loss_function(model):
        return False
    loss_on_head_slices(model, head)
    return True


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
    from ...tensor_parallel import VocabParallelLMHead1D

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

    def deferring(original):
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

        return forward

    head.loss_on_slices = True
    attached(model).route(
        model, "loss_function", "vocab_parallel", lambda inner: loss_function, what="cross entropy on the slices"
    )
    attached(model).route(model, "forward", "logits_gather_deferred", deferring, what="the gather overlaps the loss")
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
    same = storage_key(value) == storage_key(local) and value.storage_offset() == local.storage_offset()
    same = same and value.stride() == local.stride()  # (a hook's alias; a fake tensor's data pointer is 0)
    if not same:  # the model changed its head's logits (a scale, a soft cap): gather what it returns
        full = head.gather_slices(value)
    if isinstance(output, tuple):
        return (*output[:at], full, *output[at + 1 :])
    output[at] = full
    return output
