"""shardcore: one call to make a PyTorch model tensor parallel.

>>> model = shardcore.optimize(model, shardcore.ShardConfig(tensor_parallel_size=2))  # doctest: +SKIP
"""

import importlib

from .checkpoint import CheckpointError, load_checkpoint, load_distributed, save_checkpoint, save_distributed
from .composite import CompositePolicy
from .config import AutoLayout, ShardConfig
from .consistency import InputMismatch
from .cost.auto import optimize  # the core optimize, ShardConfig(auto=...) resolved first
from .distributed import ParallelLayout
from .distributed.collectives import CollectivePeerLost, CollectiveTimeout
from .grad_norm import clip_grad_norm_
from .hookspecs import hookimpl
from .inference import ParallelModel, parallelize
from .meta import init_empty
from .metrics import StepMetrics
from .pipeline import pipeline_step
from .plan.syntax import PlanError
from .plugins import NoPolicyError
from .policy import ModulePolicyDescription, Policy, SubModuleReplacementDescription
from .sharded_state import full_named_tensors
from .sharder import resolve_policy
from .tensor_parallel import (
    VocabSliceError,
    selective_checkpoint_context,
    vocab_parallel_cross_entropy,
    vocab_parallel_linear_cross_entropy,
)
from .tensor_parallel.parallel_module import ParallelModule
from .verify import ShardingCheckError

__version__ = "0.1.0"

__all__ = [
    "AutoLayout",
    "CheckpointError",
    "CollectivePeerLost",
    "CollectiveTimeout",
    "CompositePolicy",
    "InputMismatch",
    "ModulePolicyDescription",
    "NoPolicyError",
    "ParallelLayout",
    "ParallelModel",
    "ParallelModule",
    "PlanError",
    "Policy",
    "ShardConfig",
    "ShardingCheckError",
    "StepMetrics",
    "SubModuleReplacementDescription",
    "VocabSliceError",
    "__version__",
    "check",
    "clip_grad_norm_",
    "full_named_tensors",
    "hookimpl",
    "init_empty",
    "load_checkpoint",
    "load_distributed",
    "optimize",
    "parallelize",
    "pipeline_step",
    "resolve_policy",
    "save_checkpoint",
    "save_distributed",
    "selective_checkpoint_context",
    "vocab_parallel_cross_entropy",
    "vocab_parallel_linear_cross_entropy",
]


def __getattr__(name: str):
    """``shardcore.check`` (:func:`shardcore.card.check`: will a layout compute the unsharded model's
    numbers?) is loaded on first use: it brings the conformance kit, which ``import shardcore`` does not."""
    if name == "check":
        return importlib.import_module(".card", __name__).check
    raise AttributeError(f"module 'shardcore' has no attribute {name!r}")
