"""Sequence parallelism over the tensor-parallel group (``sequence_parallelism_mode="split_gather"``,
Megatron-LM's sequence parallelism), on the model's own forward.

Between the tensor-parallel regions (norms, residual adds, dropout) every rank holds only its
slice of the sequence: the hidden states are split along the sequence at the input of the first
of :meth:`shardcore.Policy.blocks` and gathered at the output of the last, so the model's
forward computes masks and positions on the whole sequence before the blocks and everything
after them (final norm, head, pooler) sees the whole sequence, as unsharded. Inside the blocks:

* a column-parallel layer (or an ``enter_tp_region`` module) all-gathers its input along the
  sequence instead of taking it as it is (Megatron's *f*: identity forward, all-reduce backward),
  and the backward reduce-scatters the input gradient instead of all-reducing it;
* a row-parallel layer reduce-scatters its partial sums along the sequence instead of
  all-reducing them (Megatron's *g*), the backward all-gathers.

Same communication volume as tensor parallelism alone (an all-reduce is a reduce-scatter and an
all-gather), but the activations outside the regions take 1/tp of the memory.

Replicated parameters used on sequence-split activations (norm weights, a row-parallel layer's
bias) get gradients from this rank's tokens only: they are summed over the group (the
parameter enters the forward through Megatron's *f*). Dropout on split activations (the policy's
:attr:`SequenceSpec.dropouts <shardcore.spec.SequenceSpec>`) draws from the per-rank random stream:
each rank drops its own tokens.

A forward whose sequence length the group does not divide (a decoding step of ``generate()``, one
token) runs without the split: plain tensor parallelism, the same numbers.

``"all_to_all"`` (DeepSpeed-Ulysses) and ``"ring_attn"`` (context parallelism) run over the
mesh's ``sp`` dim instead (:func:`apply_ulysses`): the same split of the hidden states, every
rank holding the whole model (or its TP slice); around attention Ulysses exchanges the sequence
split for a head split and back, while ``ring_attn`` keeps the heads and lets each rank's queries
(two zigzag chunks, for causal balance) attend to every rank's keys and values, passed around
the ring one block at a time. ``"all_gather_kv"`` splits as ``ring_attn`` but all-gathers the
keys and values in each attention and runs the model's own attention kernel over them.
"""

from __future__ import annotations

from ..tensor_parallel.regions import SequenceParallel
from .check import check_sequence_parallel
from .declared import heads_of
from .ring import ring_attention, zigzag_positions
from .split_gather import apply_sequence_parallel
from .ulysses import apply_ulysses, ulysses_attention

__all__ = [
    "SequenceParallel",
    "apply_sequence_parallel",
    "apply_ulysses",
    "check_sequence_parallel",
    "heads_of",
    "ring_attention",
    "ulysses_attention",
    "zigzag_positions",
]
