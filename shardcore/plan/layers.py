"""Which shardcore layer each module of a plan becomes, every split checked against the model."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..tensor_parallel import Linear1D_Col, Linear1D_Row, VocabParallelEmbedding1D, VocabParallelLMHead1D
from .syntax import PlanError, _Plan


class Layers:
    """The parallel layer of one module of the model, from its plan entries (``{"weight": (key,
    spec), "bias": ...}``): ``(layer class, kwargs, key)``, or ``None`` for a replicated module."""

    def __init__(self, plan: _Plan, tp: int, model_name: str, vocab_pad: int) -> None:
        self.plan, self.tp, self.model_name, self.vocab_pad = plan, tp, model_name, vocab_pad

    def layer(
        self, path: str, module: nn.Module, entries: dict, parent: nn.Module, is_head: bool, parallel_output: bool
    ):
        weight_key, weight_spec = entries.get("weight", (None, None))
        at = self.plan.where(weight_key or next(iter(entries.values()))[0])
        if weight_key is None or weight_spec is None or all(a is None for a in weight_spec):
            if any(s and any(a is not None for a in s) for _, s in entries.values()):
                raise PlanError(f"{at}: {path}: a bias can only be split with its weight; give {path}.weight a spec")
            return None  # replicated
        param = module.weight
        if len(weight_spec) != param.dim():
            raise PlanError(
                f"{at}: {path}.weight has {param.dim()} dimensions {tuple(param.shape)}, "
                f"the spec {weight_spec} has {len(weight_spec)}"
            )
        dim = next(i for i, a in enumerate(weight_spec) if a is not None)
        plain = (nn.Embedding, nn.Linear)
        if isinstance(module, plain) and not any(type(module).forward is c.forward for c in plain):
            raise PlanError(
                f"{at}: {path} is a {type(module).__name__}, whose forward differs from torch's "
                f"(e.g. scales its output); a plan splits plain nn.Linear / nn.Embedding layers: give it null "
                "(replicated) or write a policy"
            )
        if isinstance(module, nn.Embedding):
            if dim != 0:
                raise PlanError(
                    f"{at}: {path}.weight {weight_spec}: shardcore splits embeddings over the vocabulary "
                    "(dim 0: [tp, null]), not over the embedding width"
                )
            return VocabParallelEmbedding1D, {"make_vocab_size_divisible_by": self.vocab_pad}, weight_key
        if not isinstance(module, nn.Linear):
            raise PlanError(
                f"{at}: {path} is a {type(module).__name__}; a plan splits nn.Linear and nn.Embedding "
                "parameters (write a policy for other layers)"
            )
        column = dim == 0
        self._check_bias(path, module, entries, weight_spec, column)
        if column and is_head:  # the output embedding, or any split whose output leaves the model
            kwargs = {"gather_output": not parallel_output, "make_vocab_size_divisible_by": self.vocab_pad}
            return VocabParallelLMHead1D, kwargs, weight_key
        kwargs = self._heads(at, path, module, parent, dim, column)
        return (Linear1D_Col if column else Linear1D_Row), kwargs, weight_key

    def _check_bias(self, path: str, module: nn.Linear, entries: dict, weight_spec, column: bool) -> None:
        bias_key, bias_spec = entries.get("bias", (None, None))
        if bias_spec is not None and module.bias is not None:
            expected = [weight_spec[0]] if column else [None]
            if list(bias_spec) != expected:
                raise PlanError(
                    f"{self.plan.where(bias_key)}: {path}.bias {bias_spec}: with the weight {weight_spec} "
                    f"the bias must be {expected}"
                )

    def _heads(self, at: str, path: str, module: nn.Linear, parent: nn.Module, dim: int, column: bool) -> dict:
        """A linear layer split by whole heads where its parent has a ``head_dim`` that divides it."""
        tp = self.tp
        size = module.out_features if column else module.in_features
        head_dim = getattr(parent, "head_dim", None)
        kwargs: dict[str, Any] = {}
        if isinstance(head_dim, int) and head_dim > 0 and size % head_dim == 0:
            heads = size // head_dim
            if heads % tp and tp % heads:
                raise PlanError(
                    f"{at}: {path}.weight dim {dim}: {heads} heads of {head_dim} can neither be split over "
                    f"nor replicated on tp={tp}"
                )
            if not column and heads < tp:
                raise PlanError(f"{at}: {path}.weight dim {dim}: {heads} heads cannot be split over tp={tp}")
            kwargs = {"num_heads": heads, "head_dim": head_dim}
        elif size % tp:
            sizes = [n for n in range(2, min(size, 64) + 1) if size % n == 0][:4]
            fix = (
                f"use a tensor_parallel_size that divides {size} ({', '.join(map(str, sizes))})"
                if sizes
                else f"no tensor_parallel_size up to 64 divides {size}: give it null (replicated)"
            )
            raise PlanError(
                f"{at}: {path}.weight dim {dim} has size {size}, not divisible by tp={tp} (in {self.model_name}), "
                f"and its output feeds the model, not its output (only a split leaving the model is padded); {fix}"
            )
        return kwargs


def splits_heads(module: nn.Module, parent: nn.Module | None) -> bool:
    """Whether a column-split linear is split by whole heads (its parent has a ``head_dim`` dividing it)."""
    head_dim = getattr(parent, "head_dim", None)
    size = getattr(module, "out_features", None)
    return isinstance(head_dim, int) and head_dim > 0 and isinstance(size, int) and size % head_dim == 0
