"""What a policy says about sequence parallelism (:class:`SequenceHooks`, a base of :class:`~shardcore.Policy`)."""

from __future__ import annotations

from torch import nn


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

    def sequence_parallel_regions(self) -> list[list[tuple[str, nn.Module]]]:
        """Runs of consecutive blocks that ``split_gather`` splits along the sequence, each at its
        first block's input and gathered at its last block's output: by default one, all of
        :meth:`blocks`. An encoder-decoder whose decoder reads the encoder's whole output
        (cross-attention) names its encoder's blocks only."""
        return [self.blocks()]

    def sequence_parallel_heads(self) -> tuple[int, int]:
        """``(attention heads, key/value heads)`` for ``all_to_all``, which gives each rank whole heads."""
        raise NotImplementedError(f"{type(self).__name__} does not implement sequence_parallel_heads()")

    def sequence_attention_problem(self, mode: str = "all_to_all") -> str | None:
        """Why :meth:`set_sequence_attention` cannot run ``mode`` on this model (``None``: it can);
        asked before any collective. :class:`~shardcore.Policy` answers for HuggingFace's attention
        registry; here, below the kernels, nothing can."""
        return f"sequence_parallelism_mode={mode!r}: {type(self).__name__} does not say how its attention runs under it"

    def set_sequence_attention(self, state) -> str:
        """Make the model's attention run under ``all_to_all`` (see
        :func:`shardcore.sequence.ulysses_attention`); returns the name now in use.
        :class:`~shardcore.Policy` registers it in HuggingFace's attention registry."""
        raise NotImplementedError(self.sequence_attention_problem(state.mode))
