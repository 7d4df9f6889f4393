"""0.x's sequence-parallel members of a policy (:class:`SequenceHooks`), kept for this minor version: a policy now
returns a :class:`~shardcore.spec.SequenceSpec` from ``sequence()``; a 0.x policy's own members are read into it
(:mod:`shardcore.spec.legacy`), and these defaults are the spec's (regions: every block; attention: the registry)."""

from __future__ import annotations


class SequenceHooks:
    """The sequence-parallel part of the policy contract; defaults: no sequence parallelism."""

    #: The ``ShardConfig.sequence_parallelism_mode`` values this policy supports (see
    #: :mod:`shardcore.sequence`); ``optimize`` refuses the others, naming them.
    sequence_parallelism_modes: tuple[str, ...] = ()

    #: Dropout modules (suffixes inside each block) that act on sequence-split activations under
    #: sequence parallelism (residual dropout): they then draw from the per-rank random stream.
    sequence_parallel_dropouts: tuple[str, ...] = ()

    #: Keyword arguments of every block that run along the sequence with the hidden states
    #: (rotary ``position_embeddings``): under ``all_to_all`` / ``ring_attn`` each rank takes its slice.
    sequence_split_kwargs: tuple[str, ...] = ()

    def sequence_parallel_heads(self) -> tuple[int, int]:
        """``(attention heads, key/value heads)`` for ``all_to_all``, which gives each rank whole heads."""
        raise NotImplementedError(f"{type(self).__name__} does not implement sequence_parallel_heads()")
