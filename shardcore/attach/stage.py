"""Whether a model's forward runs now as one pipeline stage's (:mod:`shardcore.pipeline.stage`): a context
variable, not a flag set on the model, so a forward in another thread (or task) of the same model is not
taken for a stage's, and nothing is left on the model when a stage raises.

The hooks :mod:`shardcore.attach` runs read it: inside a stage, ``pipeline_step`` checked the batch and
agrees on fp16 overflow once per step, and the model's forward is the stage's own, not the whole pipeline.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from torch import nn

__all__ = ["in_stage", "running_stage"]

#: the ids of the models whose forward runs now as a pipeline stage's
_STAGES: ContextVar[frozenset[int]] = ContextVar("shardcore_pipeline_stages", default=frozenset())


def in_stage(model: nn.Module) -> bool:
    """Whether ``model``'s forward runs now inside one of its pipeline stages."""
    return id(model) in _STAGES.get()


@contextlib.contextmanager
def running_stage(model: nn.Module) -> Iterator[None]:
    """``model``'s forward inside this block is a pipeline stage's."""
    token = _STAGES.set(_STAGES.get() | {id(model)})
    try:
        yield
    finally:
        _STAGES.reset(token)
