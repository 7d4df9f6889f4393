"""Vocabulary-parallel embedding and LM head.

The vocabulary ``V`` is zero-padded to ``V_p``, a multiple of ``make_vocab_size_divisible_by *
p``, and rank ``r`` holds rows ``[r V_p / p, (r + 1) V_p / p)``. Padding rows are never visible.

* :class:`VocabParallelEmbedding1D`: each rank looks up the ids in its range (others give
  zeros) and one all-reduce sums the partial embeddings. Backward sends nothing.
* :class:`VocabParallelLMHead1D`: a column-parallel linear over the vocabulary. Backward
  all-reduces ``dL/dx`` once. Forward either all-gathers the logits and drops the padding
  (full-vocab logits, exactly like the native head), or, with ``gather_output=False``, returns
  this rank's valid logits only, marked as a slice (:mod:`~shardcore.tensor_parallel.vocab_slice`: a
  whole-logits loss on it raises), for :func:`~shardcore.tensor_parallel.vocab_parallel_cross_entropy`.
  With ``defer_gather`` set, a forward that gathers returns this rank's valid logits and leaves
  the all-gather running until :meth:`~VocabParallelLMHead1D.finish_gather`: the model's loss is
  computed on the slice meanwhile (:func:`shardcore.integrations.hf.causal_lm_loss.defer_logits_gather`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.collectives import group_size
from .mappings import copy_to_tp, gather_from_tp, reduce_from_tp, start_gather_from_tp
from .parallel_module import ParallelModule
from .shard_spec import ShardSpec
from .vocab_slice import mark_slice

__all__ = ["VocabParallelEmbedding1D", "VocabParallelLMHead1D"]


class VocabParallelEmbedding1D(ParallelModule):
    """Embedding with the vocabulary split over the group (see the module docstring)."""

    def __init__(
        self, weight: torch.Tensor, spec: ShardSpec, process_group=None, *, padding_idx: int | None = None
    ) -> None:
        super().__init__(process_group)
        self.num_embeddings = spec.full_size
        self.embedding_dim = weight.shape[1]
        self.spec = spec
        self._shard_param("weight", weight, spec)
        ((start, stop, _),) = spec.ranges(self.tp_rank)
        self.vocab_start, self.vocab_end = start, stop
        self.padding_idx = padding_idx
        self._local_padding_idx = (
            padding_idx - start if padding_idx is not None and start <= padding_idx < stop else None
        )

    @classmethod
    def from_native_module(
        cls, module: nn.Embedding, process_group=None, *, make_vocab_size_divisible_by: int = 64
    ) -> VocabParallelEmbedding1D:
        cls._expect_native(module, nn.Embedding)
        spec = ShardSpec.padded(module.num_embeddings, group_size(process_group), make_vocab_size_divisible_by)
        return cls(module.weight, spec, process_group, padding_idx=module.padding_idx)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(ids, self.weight, self._local_padding_idx)
        # every rank masks ids outside its slice: unchecked, an unknown id would embed as zeros. A
        # device-side assert (no host sync: on CUDA it fails like the unsharded embedding's index check)
        torch._assert_async(
            ((ids >= 0) & (ids < self.num_embeddings)).all(),
            f"a token id is outside the vocabulary [0, {self.num_embeddings}); "
            "the unsharded embedding raises 'index out of range' too",
        )
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight, self._local_padding_idx)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(out, self.process_group, fresh=True)  # computed here, held by nobody else

    def collectives(self) -> dict[str, list[str]]:
        return {"forward": ["all_reduce"] if self.tp_size > 1 else [], "backward": []}

    def collective_bytes(self, tokens: int, itemsize: int) -> dict[str, list[int]]:
        return {"forward": [tokens * self.embedding_dim * itemsize] if self.tp_size > 1 else [], "backward": []}

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim}, rank {self.tp_rank}/{self.tp_size} holds ids "
            f"[{self.vocab_start}, {self.vocab_end}) (padded vocab {self.spec.segments[0].padded_size})"
        )


class VocabParallelLMHead1D(ParallelModule):
    """Output projection with the vocabulary split over the group (see the module docstring)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        spec: ShardSpec,
        process_group=None,
        *,
        gather_output: bool = True,
    ) -> None:
        super().__init__(process_group)
        self.in_features = weight.shape[1]
        self.out_features = spec.full_size
        self.gather_output = gather_output
        self.spec = spec
        self._shard_param("weight", weight, spec)
        self._shard_param("bias", bias, spec)
        ((start, stop, _),) = spec.ranges(self.tp_rank)
        self.vocab_start, self.vocab_end = start, stop

    @classmethod
    def from_native_module(
        cls,
        module: nn.Linear,
        process_group=None,
        *,
        gather_output: bool = True,
        make_vocab_size_divisible_by: int = 64,
    ) -> VocabParallelLMHead1D:
        cls._expect_native(module, nn.Linear)
        spec = ShardSpec.padded(module.out_features, group_size(process_group), make_vocab_size_divisible_by)
        return cls(module.weight, module.bias, spec, process_group, gather_output=gather_output)

    #: whether the model computes its loss on this head's vocabulary slices
    #: (:func:`~shardcore.tensor_parallel.vocab_parallel_cross_entropy`; counted by :meth:`collectives`)
    loss_on_slices: bool = False
    #: set by :func:`shardcore.integrations.hf.causal_lm_loss.defer_logits_gather` while the model's forward runs: forward
    #: starts the gather and returns the slice
    defer_gather: bool = False
    #: the valid slice of the logits whose gather is running, and what finishes it
    pending_logits: torch.Tensor | None = None
    _finish = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(copy_to_tp(x, self.process_group), self.weight, self.bias)
        local = logits[..., : self.vocab_end - self.vocab_start]
        if self.gather_output and self.defer_gather:
            self._finish = start_gather_from_tp(logits, self.process_group, dim=-1)
            self.pending_logits = local
            return local
        if self.gather_output:
            return gather_from_tp(logits, self.process_group, dim=-1)[..., : self.out_features]
        # marked: no F.cross_entropy on it (the slice's refusal), shardcore.vocab_parallel_cross_entropy reads it
        return mark_slice(local, self.vocab_start, self.out_features, self.process_group, self.weight.shape[0])

    def finish_gather(self) -> torch.Tensor:
        """The full-vocabulary logits of the last forward (``defer_gather``): waits for their all-gather."""
        if self._finish is None:
            raise RuntimeError(f"{type(self).__name__}.finish_gather(): no gather is running (defer_gather)")
        finish, self._finish, self.pending_logits = self._finish, None, None
        return finish()[..., : self.out_features]

    def gather_slices(self, local: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits from every rank's valid slice ``local`` (``[..., vocab_end - vocab_start]``,
        e.g. the head's output scaled by the model): padded to the equal slices, all-gathered."""
        padded = F.pad(local, (0, self.weight.shape[0] - local.shape[-1]))
        return gather_from_tp(padded, self.process_group, dim=-1)[..., : self.out_features]

    def drop_gather(self) -> None:
        """Forget the gather of the last forward (it raised before the logits were used)."""
        self._finish = self.pending_logits = None

    def collectives(self) -> dict[str, list[str]]:
        forward = ["all_gather"] if self.gather_output else []
        if self.loss_on_slices:  # a step with labels: the vocab-parallel cross entropy's one all-gather
            forward.append("all_gather")
        return {"forward": forward, "backward": ["all_reduce"]}

    def collective_bytes(self, tokens: int, itemsize: int) -> dict[str, list[int]]:
        forward = [tokens * self.spec.local_size * itemsize] if self.gather_output else []
        if self.loss_on_slices:  # max, sum of exponentials, target logit per token, in float32
            forward.append(3 * tokens * 4)
        return {"forward": forward, "backward": [tokens * self.in_features * itemsize]}

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, vocab={self.out_features}, rank {self.tp_rank}/{self.tp_size} "
            f"holds [{self.vocab_start}, {self.vocab_end}), gather_output={self.gather_output}"
        )
