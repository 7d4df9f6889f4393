"""Pipeline parallelism on the mesh's ``pp`` dimension, on ``torch.distributed.pipelining``, with
the model's own forward.

A stage is the model itself with what other stages hold taken out: the blocks of
:meth:`shardcore.Policy.blocks` outside the stage's range become :class:`PipelineHole` modules
(no parameters; they hand their input through), and the modules only the first stage runs (the
embedding) or only the last (the final norm, the head) become holes elsewhere
(:attr:`PipelineSpec.ends <shardcore.spec.PipelineSpec>`). Nothing is renamed: a held parameter keeps its
unsharded name (``model.layers.5.mlp.up_proj.weight``), so optimizers, checkpoints and
:func:`shardcore.full_named_tensors` work as before. The policy says how the model runs on one
stage's inputs (:attr:`PipelineSpec.stage_forward <shardcore.spec.PipelineSpec>`: for a HuggingFace decoder, the
hidden states enter later stages as ``inputs_embeds``) and how a microbatch's loss is weighed
(:attr:`PipelineSpec.loss <shardcore.spec.PipelineSpec>`), so that the loss of the whole batch is the unsharded
model's even when microbatches hold different numbers of label tokens.

:func:`pipeline_step` runs one training step over the microbatches with the configured schedule
and returns the loss on every rank; on a model without pipeline parallelism it is
``model(**batch).loss.backward()``.
"""

from __future__ import annotations

from .check import PipelineInfo, check_pipeline
from .hole import PipelineHole
from .runtime import pipeline_step, tensor_aliases
from .schedule import schedule_names, split_layers
from .stage import build_pipeline

__all__ = [
    "PipelineHole",
    "PipelineInfo",
    "build_pipeline",
    "check_pipeline",
    "pipeline_step",
    "schedule_names",
    "split_layers",
    "tensor_aliases",
]
