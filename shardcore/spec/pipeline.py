"""What pipeline parallelism reads from a family (see :mod:`shardcore.pipeline`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

__all__ = ["PipelineSpec"]


@attrs.frozen(kw_only=True)
class PipelineSpec:
    """How a model runs as pipeline stages on its own forward. ``Policy.pipeline()`` returns one, or ``None``:
    pipeline parallelism is refused, naming the policy. A HuggingFace plugin gets one from
    :class:`shardcore.plugin_api.HFStages` (it says, as data, what differs for its family).

    * ``ends``: ``{path: "first" | "last" | block index}``, the modules outside the blocks only one stage
      runs: the first (the embedding), the last (final norm, head), or the stage holding block ``i`` (an
      encoder-decoder's decoder embedding with its first decoder block). Other stages hold holes there. A
      path may name a parameter of a module that stays (timm's root ``cls_token``).
    * ``zero_ends``: paths of ``ends`` whose output the model *adds* to the hidden states (a position
      embedding): their holes return zero instead of handing the input through.
    * ``inputs(batch, training)``: ``(positional inputs of the first stage, labels or None)`` from a batch as
      the model takes it; every tensor with the batch as dim 0 (cut into microbatches). ``training=False``:
      a forward through the pipeline (what ``generate()`` passes may come too).
    * ``stage_forward(inputs, first=, last=)``: run the model (pruned to this rank's stages) on one stage's
      inputs; the first stage's are ``inputs``'s, later ones what the previous stage returned; the last
      returns what ``loss`` takes (logits).
    * ``output(output, loss, *extra)``: what ``model(...)`` returns from the last stage's output (and loss,
      or ``None``); ``extra``: its further outputs when it returns a tuple.
    * ``num_items(labels)``: the number of loss terms of the whole batch.
    * ``loss(output, labels, num_items)``: one microbatch's loss summed over its terms, divided by the
      whole batch's ``num_items`` (the microbatches add up to the whole batch's mean).
    * ``block_returns_tuple``: a block returns ``(hidden, ...)`` rather than the hidden states (what its
      hole returns). ``None``: ``True`` for a HuggingFace model under transformers 4, else ``False``. A
      tuple of indices: the block returns those positional arguments of its call, changed (T5's blocks
      take and return the position biases the stack hands from block to block: ``(0, 2, 5)``); its
      hole hands them on unchanged.
    * ``generate_refusal``: why ``generate()`` cannot run through the stages (``None``: it can).
    * ``blocks()``: the ``(name, block)`` the stages are cut from, when not all of ``Policy.blocks()``
      (a composite's language model's: its vision tower, whole, is one of the ``ends`` of the first stage).

    Composite: the composite's own (its forward joins the parts); parts' pipelines are not joined.
    """

    ends: Mapping[str, str | int]
    inputs: Callable
    stage_forward: Callable
    output: Callable
    num_items: Callable
    loss: Callable
    zero_ends: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    block_returns_tuple: bool | tuple[int, ...] | None = None
    generate_refusal: str | None = None
    blocks: Callable | None = None

    @classmethod
    def merge(cls, own: PipelineSpec | None, parts: Mapping[str, PipelineSpec | None]) -> PipelineSpec | None:
        return own
