"""A sharded model's state dict taken by another tool's distributed checkpoint: refused by name.

``model.state_dict()`` of a sharded model holds each rank's slice of a split parameter under the
unsharded name (see docs/user_workflow.md). ``torch.distributed.checkpoint``'s state-dict API
(``get_model_state_dict`` / ``set_model_state_dict``, what Lightning's ``fabric.save`` / ``load`` and
``ModelParallelStrategy``'s checkpoints, accelerate's FSDP2 save and torchtitan call) reads such a
tensor as the same tensor on every rank: under FSDP it saves one tensor-parallel rank's slice of each
split parameter and loses the others, and a load gives every rank that slice (measured through
Lightning Fabric at FSDP=2 x TP=2: parameters off by 0.12 after a reload, no error). So a sharded
model's ``state_dict``, when called from that API, raises on every rank alike, before any collective,
naming :func:`shardcore.save_distributed` / :func:`shardcore.load_distributed`, which write each
slice as its piece of the unsharded tensor. Any other caller (``save_pretrained``, ``torch.save(
model.state_dict())``, PEFT) is untouched.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable

from torch import nn

from ..attach import attached
from ..sharded_state import parameter_specs

__all__ = ["DCP_STATE_DICT", "refuse_foreign_state_dicts"]

#: the file of torch's distributed-checkpoint state-dict API, as a caller's frame names it
DCP_STATE_DICT = os.path.join("torch", "distributed", "checkpoint", "state_dict.py")


def _dcp_caller() -> str | None:
    """The function of torch's distributed-checkpoint state-dict API on the stack, if any."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.endswith(DCP_STATE_DICT):
            return frame.f_code.co_name
        frame = frame.f_back
    return None


def refuse_foreign_state_dicts(model: nn.Module) -> None:
    """Route ``model.state_dict`` so that a call from DCP's state-dict API on a model with split
    parameters raises (see the module's docstring); every other call runs as before."""

    def wrap(inner: Callable) -> Callable:
        @functools.wraps(inner)
        def state_dict(*args, **kwargs):
            caller = _dcp_caller()
            split = sorted(parameter_specs(model)) if caller is not None else ()
            if split:
                raise RuntimeError(
                    f"torch.distributed.checkpoint's state-dict API ({caller}; Lightning's fabric.save / load and "
                    f"checkpoints, accelerate's FSDP2 save, torchtitan) on a sharded {type(model).__name__}: its "
                    f"{len(split)} split parameters ({', '.join(split[:2])}, ...) are each rank's slice under the "
                    "unsharded name, which that API would store as one tensor, keeping one rank's slice and losing "
                    "the others. Save with shardcore.save_distributed(model, path, optimizer) and load with "
                    "shardcore.load_distributed(model, path, optimizer) (any TP size), or model.save_pretrained "
                    "for the unsharded weights"
                )
            return inner(*args, **kwargs)

        return state_dict

    attached(model).route(
        model, "state_dict", "refuse_foreign_dcp", wrap, what="refused from DCP's state-dict API (split parameters)"
    )
