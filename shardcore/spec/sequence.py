"""What sequence parallelism reads from a family (see :mod:`shardcore.sequence`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs

__all__ = ["SequenceSpec"]


@attrs.frozen(kw_only=True)
class SequenceSpec:
    """How a model runs with its sequence split. The default declares nothing: every mode refused.

    * ``modes``: the ``ShardConfig.sequence_parallelism_mode`` values supported; ``optimize`` refuses
      the others, naming them.
    * ``refused``: ``{mode: why}`` for modes the model cannot run and the reason, which ``optimize``
      (and the feature tables) give instead of the list of supported modes.
    * ``dropouts``: dropout modules (suffixes inside each block) acting on sequence-split activations
      (residual dropout): they then draw from the per-rank random stream.
    * ``split_kwargs``: keyword arguments of every block that run along the sequence with the hidden
      states (rotary ``position_embeddings``): under ``all_to_all`` / ``ring_attn`` each rank takes its slice.
    * ``block_inputs``: a block's own tensor arguments besides the hidden states, laid out as they are,
      ``(batch, sequence, ...)`` (Gemma 4's per-layer input): under ``all_to_all`` / ``ring_attn`` each rank takes
      its slice along the hidden states' dimension; one that does not run along it is refused at the step.
    * ``gathered``: modules of the blocks (full names, as :meth:`~shardcore.Policy.blocks` names the
      blocks) that mix tokens outside the attention (a linear attention, a state-space or short-convolution
      mixer): under ``all_to_all`` / ``ring_attn`` each runs over the whole sequence (its input gathered over
      the group, its output cut back to this rank's part; :mod:`shardcore.sequence.gathered`).
    * ``mask_builders``: methods of the blocks' attention modules (full names, ``<module>.<method>``) that
      build the mask the module hands the attention function from what runs along the sequence (Doge's
      dynamic mask from its value states): under ``all_to_all`` / ``ring_attn`` each runs over the whole
      sequence (its tensor arguments gathered over the group) and returns the whole sequence's mask, which
      the attention function cuts to the rank's heads (Ulysses) or takes at its queries (the ring).
    * ``unmixed``: blocks (full names) that mix no tokens at all (a hybrid's feed-forward-only layers): the
      check that every split block ran its attention (or a gathered mixer) passes them.
    * ``heads``: ``(attention heads, key/value heads)``; ``all_to_all`` gives each rank whole heads.
    * ``per_head``: names of attention-module attributes and keyword arguments of the attention
      function holding one value per query head (attention sinks); under ``all_to_all`` the attention
      sees this rank's heads' slice of each.
    * ``regions``: runs of consecutive ``(name, block)`` that every mode splits at the first block's
      input and gathers at the last's output. ``None``: one, all of ``blocks()``. An encoder-decoder whose
      decoder reads the encoder's whole output names its encoder's blocks only.
    * ``causal``: ``False`` for bidirectional attention (an encoder): ``ring_attn`` then splits the sequence
      in contiguous parts, one a rank, so the group need only divide the length. A causal model's ring
      splits it in zigzag order (two chunks a rank, for causal balance): the length by ``2 x sp``.
    * ``routed``: the policy vouches that the model's attention reads the library's registry at each
      call though the model class does not say so (transformers' ``_supports_attention_backend``,
      which Whisper's leaves unset): the registry switches it all the same.
    * ``attention_problem(mode)``: why the attention cannot run under ``mode`` (``None``: it can), asked
      before any collective (for ``split_gather`` too: why the blocks' region cannot be followed); ``set_attention(state)``: make it run under ``state.mode``, the name now in use.
      ``None``: HuggingFace's attention registry, around the model's own attention.

    Composite: the composite's own (its forward joins the parts).
    """

    modes: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    refused: Mapping[str, str] = attrs.field(factory=dict, converter=dict)
    dropouts: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    split_kwargs: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    block_inputs: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    gathered: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    mask_builders: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    unmixed: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    heads: tuple[int, int] | None = None
    per_head: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    regions: Sequence[Sequence[tuple[str, object]]] | None = None
    causal: bool = True
    routed: bool = False
    attention_problem: Callable[[str], str | None] | None = None
    set_attention: Callable | None = None

    @classmethod
    def merge(cls, own: SequenceSpec | None, parts: Mapping[str, SequenceSpec]) -> SequenceSpec:
        return own or cls()  # the composite's own forward joins the parts: its word alone (none: every mode refused)
