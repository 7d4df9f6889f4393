"""0.x's pipeline members of a policy (:class:`PipelineHooks`), kept for this minor version: a policy now returns a
:class:`~shardcore.spec.PipelineSpec` from ``pipeline()``; a 0.x policy's own members are read into it
(:mod:`shardcore.spec.legacy`).

A policy without them refuses pipeline parallelism, naming the hooks it lacks; a HuggingFace plugin
gets them all from :class:`shardcore.integrations.hf.stages.HFStages`.
"""

from __future__ import annotations

from typing import Any


class PipelineHooks:
    """The pipeline part of the policy contract (see :mod:`shardcore.pipeline`)."""

    #: Whether a block returns ``(hidden, ...)`` rather than the hidden states (``None``: ``True`` for a
    #: HuggingFace model under transformers 4.x, else ``False``; :attr:`PipelineSpec.block_returns_tuple
    #: <shardcore.spec.PipelineSpec>`).
    pipeline_block_returns_tuple: bool | tuple[int, ...] | None = None

    #: Why ``generate()`` cannot run through this model's pipeline stages (``None``: it can).
    pipeline_generate_unsupported: str | None = None

    def pipeline_ends(self) -> dict[str, str | int]:
        """``{path: "first" | "last" | block index}``: the modules outside :meth:`blocks` only one
        stage runs: the first (the embedding), the last (final norm, head), or the stage holding
        block ``i`` (an encoder-decoder's decoder embedding goes with its first decoder block).
        Other stages hold holes in their place. A path may name a parameter of a module that
        stays (timm's root ``cls_token``): the stages that do not hold it do not have it."""
        raise NotImplementedError(f"{type(self).__name__} does not implement pipeline_ends()")

    def pipeline_zero_ends(self) -> tuple[str, ...]:
        """Paths of :meth:`pipeline_ends` whose output the model *adds* to the hidden states (a
        position embedding): their holes return zero instead of handing the input through. Default: none."""
        return ()

    def pipeline_inputs(self, batch: dict, training: bool = True) -> tuple[tuple, Any]:
        """``(positional inputs of the first stage, labels or None)`` from a batch as the model
        takes it (keyword arguments); every tensor with the batch as its first dimension (they are
        cut into microbatches). ``training=False``: a forward through the pipeline (arguments
        ``generate()`` passes may come too)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement pipeline_inputs()")

    def pipeline_stage_forward(self, inputs: tuple, *, first: bool, last: bool):
        """Run ``self.model`` (pruned to this rank's stages) on one stage's inputs: the first
        stage's are :meth:`pipeline_inputs`; the others get what the previous stage returned. The
        last stage returns what :meth:`pipeline_loss` takes (logits)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement pipeline_stage_forward()")

    def pipeline_output(self, output, loss, *extra):
        """What ``model(...)`` returns from the last stage's ``output`` (and ``loss``, or ``None``)
        when a forward runs through the pipeline; ``extra``: the last stage's further outputs when
        it returns a tuple (``output`` is its first element)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement pipeline_output()")

    def pipeline_num_items(self, labels) -> Any:
        """The number of loss terms of the whole batch (label tokens the loss counts)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement pipeline_num_items()")

    def pipeline_loss(self, output, labels, num_items):
        """One microbatch's loss summed over its terms and divided by the whole batch's
        ``num_items``: the microbatches' losses then add up to the whole batch's mean loss."""
        raise NotImplementedError(f"{type(self).__name__} does not implement pipeline_loss()")
