"""This rank's slice of vocabulary-split logits, marked so that it cannot pass for the whole.

With ``ShardConfig(parallel_output=True)`` a vocabulary-parallel head returns columns
``[vocab_start, vocab_end)`` of the logits on each rank. A loss written for whole logits
(``F.cross_entropy``, a softmax, an argmax) computes another number on a slice, with no error. The
slice is therefore a :class:`VocabSlice`: a tensor (through PyTorch's ``__torch_function__``
protocol) that

* raises :class:`VocabSliceError`, naming the fix, when it meets one of those functions;
* carries its mark through every operation that keeps a dimension of its width (the vocabulary):
  ``view``, ``reshape``, ``float``, ``transpose``, indexing of the other dimensions, a scale;
* gives every other result as a plain tensor, and is read by
  :func:`~shardcore.tensor_parallel.vocab_parallel_cross_entropy` (and ``shardcore.vocab_parallel_cross_entropy``),
  which takes the slice's vocabulary offset and group from the mark.

Nothing else changes: the values, the autograd graph and the memory are the slice's own.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["VocabSlice", "VocabSliceError", "gather_vocab", "mark_slice", "plain", "slice_of"]


class VocabSliceError(RuntimeError):
    """A function written for whole logits met this rank's vocabulary slice of them."""


#: functions whose result on a slice is silently another number than on the whole logits
_REFUSED = {
    F.cross_entropy: "F.cross_entropy",
    F.nll_loss: "F.nll_loss",
    F.log_softmax: "F.log_softmax",
    F.softmax: "F.softmax",
    torch.log_softmax: "torch.log_softmax",
    torch.softmax: "torch.softmax",
    torch.Tensor.log_softmax: "Tensor.log_softmax",
    torch.Tensor.softmax: "Tensor.softmax",
    torch.argmax: "torch.argmax",
    torch.Tensor.argmax: "Tensor.argmax",
    torch.logsumexp: "torch.logsumexp",
    torch.Tensor.logsumexp: "Tensor.logsumexp",
}


class VocabSlice(torch.Tensor):
    """Columns ``[vocab_start, vocab_start + width)`` of ``vocab_size`` logits, on one rank of ``group``."""

    _vocab: tuple[int, int, Any, int]  # (vocab_start, vocab_size, group, columns each rank holds, padded)

    def __reduce_ex__(self, protocol):  # torch.save / pickle: the values, as a plain tensor (no group)
        return plain(self).__reduce_ex__(protocol)

    def __deepcopy__(self, memo):  # a copy is the values, not a slice bound to this group
        return plain(self).__deepcopy__(memo)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        mark = next((a for a in _flat(args, kwargs) if isinstance(a, VocabSlice)), None)
        with torch._C.DisableTorchFunctionSubclass():  # (a property of the slice, .shape, would come back here)
            width = mark.shape[-1] if mark is not None and mark.dim() else None
            if func in _REFUSED and mark is not None:
                start, size = mark._vocab[:2]
                raise VocabSliceError(
                    f"{_REFUSED[func]} on this rank's slice of the logits (vocabulary [{start}, {start + (width or 0)}) "
                    f"of {size}: ShardConfig(parallel_output=True)) computes another number than on the whole "
                    "logits; use shardcore.vocab_parallel_cross_entropy(logits, targets) for the loss, or shard "
                    "with parallel_output=False to get the whole logits"
                )
            out = func(*args, **kwargs)
            if mark is None or func is torch.Tensor.as_subclass:
                return out
            return _carry(out, mark._vocab, width)


def _flat(args: tuple, kwargs: dict):
    for value in (*args, *kwargs.values()):
        if isinstance(value, list | tuple):
            yield from value
        else:
            yield value


def _carry(out: Any, vocab: tuple, width: int | None) -> Any:
    """``out`` with the mark on each tensor that keeps a dimension of the vocabulary's width (moved by a
    ``transpose`` for ``F.cross_entropy(logits.transpose(1, 2), y)``, it is still the vocabulary)."""
    if isinstance(out, torch.Tensor) and not isinstance(out, VocabSlice):
        if width is not None and width in out.shape and out.is_floating_point():
            return mark_slice(out, *vocab)
        return out
    if type(out) is tuple and any(isinstance(o, torch.Tensor) for o in out):  # (chunk, split: not torch.Size)
        return tuple(_carry(o, vocab, width) for o in out)
    return out


def mark_slice(logits: torch.Tensor, vocab_start: int, vocab_size: int, group, padded: int) -> VocabSlice:
    """``logits`` (this rank's columns from ``vocab_start`` of ``vocab_size``, ``padded`` columns per
    rank with the vocabulary's padding), marked; same storage and graph."""
    marked = logits.as_subclass(VocabSlice)
    marked._vocab = (vocab_start, vocab_size, group, padded)
    return marked


def slice_of(logits: torch.Tensor) -> tuple[int, int, Any, int] | None:
    """``(vocab_start, vocab_size, group, padded columns per rank)`` of a marked slice, ``None`` for a plain tensor."""
    return getattr(logits, "_vocab", None) if isinstance(logits, VocabSlice) else None


def plain(logits: torch.Tensor) -> torch.Tensor:
    """The slice as a plain tensor (same storage and graph)."""
    return logits.as_subclass(torch.Tensor) if isinstance(logits, VocabSlice) else logits


def gather_vocab(logits: torch.Tensor) -> torch.Tensor:
    """The whole vocabulary's logits from every rank's marked slice (one all-gather; differentiable):
    for an evaluation or a metric beside a ``parallel_output=True`` loss. Run on every rank of the group."""
    from .mappings import gather_from_tp

    mark = slice_of(logits)
    if mark is None:
        raise TypeError("gather_vocab: these logits carry no vocabulary slice (ShardConfig(parallel_output=True)'s)")
    _, size, group, padded = mark
    local = plain(logits)
    local = F.pad(local, (0, padded - local.shape[-1]))
    return gather_from_tp(local, group, dim=-1)[..., :size]
