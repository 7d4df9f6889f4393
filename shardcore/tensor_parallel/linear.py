"""Column- and row-parallel linear layers (Megatron-LM's 1D tensor parallelism).

With ``W`` of shape ``[out, in]`` and ``p`` ranks:

* :class:`Linear1D_Col` splits ``W`` by rows (output features): rank ``r`` computes
  ``y_r = x W_r^T + b_r``. Forward sends nothing (unless ``gather_output``, an all-gather of
  ``y``); backward all-reduces ``dL/dx`` once.
* :class:`FusedLinear1D_Col` is the column layer for packed projections (``qkv``): each packed
  part is split on its own, head by head, so rank ``r`` holds ``[q_r; k_r; v_r]``.
* :class:`Linear1D_Row` splits ``W`` by columns (input features): ``y = sum_r x_r W_r^T + b``,
  one all-reduce forward, nothing backward.

A column layer followed by a row layer (attention, MLP) thus costs exactly one all-reduce in
forward and one in backward. Both are ``nn.Linear`` subclasses (``in_features`` / ``out_features``
the full sizes) so that tools wrapping linear layers, PEFT's LoRA among them, accept them; their
parameters are this rank's slices (see :mod:`shardcore.integrations.hf.peft`). Heads that are replicated (fewer KV heads than ranks) get their
weight gradient summed over the ranks sharing them, so every copy stays identical.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.collectives import all_reduce, backward_of, group_size
from ..distributed.groups import replica_group
from .mappings import gather_from_tp, split_to_tp
from .parallel_module import ParallelModule
from .regions import enter_region, linear_leave_region
from .shard_spec import Segment, ShardSpec

__all__ = ["FusedLinear1D_Col", "Linear1D_Col", "Linear1D_Row", "sum_replica_rows"]


def sum_replica_rows(grad: torch.Tensor, spec: ShardSpec, groups, where: str) -> torch.Tensor:
    """``grad`` with the rows of each replicated segment summed over its replica group (a copy)."""
    grad = grad.clone()
    offset = 0
    for seg, group in zip(spec.segments, groups, strict=True):
        if group is not None:
            part = grad.narrow(spec.dim, offset, seg.shard_len).contiguous()
            all_reduce(part, group, where=where)
            grad.narrow(spec.dim, offset, seg.shard_len).copy_(part)
        offset += seg.shard_len
    return grad


class _SyncReplicaGrads(torch.autograd.Function):
    """Forward: identity on a weight. Backward: sum the gradient of replicated rows over their replica group."""

    @staticmethod
    def forward(ctx, weight, spec, groups):
        ctx.spec, ctx.groups, ctx.where = spec, groups, backward_of(" (replicated KV rows)")
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad):
        return sum_replica_rows(grad, ctx.spec, ctx.groups, ctx.where), None, None


class FromLinear:
    """Mixin: the native module is an ``nn.Linear`` (weight ``[out, in]``)."""

    #: ``True`` for weights stored ``[in, out]`` (see :mod:`shardcore.tensor_parallel.conv1d`).
    transposed = False

    @classmethod
    def _native(cls, module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, int, int]:
        """``(weight, bias, in_features, out_features)`` of the native module this layer replaces."""
        cls._expect_native(module, nn.Linear)
        return module.weight, module.bias, module.in_features, module.out_features


class Linear1D_Col(FromLinear, ParallelModule, nn.Linear):
    """Column-parallel linear: output features split over the group (see the module docstring).

    ``gather_output=True`` all-gathers the output so callers see the full ``out_features``.
    ``copy_input=False`` when the input already entered the TP region (see
    :func:`~shardcore.tensor_parallel.enter_tp_region`), so layers sharing an input share one all-reduce.

    ``spec`` describes the output features (split along dim 0 of ``[out, in]`` weights and of the
    bias); subclasses with ``transposed = True`` store ``[in, out]`` weights (split along dim 1).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        spec: ShardSpec,
        process_group=None,
        *,
        gather_output: bool = False,
        copy_input: bool = True,
    ) -> None:
        super().__init__(process_group)
        self.copy_input = copy_input
        self.in_features = weight.shape[0 if self.transposed else 1]
        self.out_features = spec.full_size
        self.gather_output = gather_output
        self.spec = spec
        self.weight_spec = attrs.evolve(spec, dim=1) if self.transposed else spec
        self._shard_param("weight", weight, self.weight_spec)
        self._shard_param("bias", bias, spec)
        self._replica_groups = None
        if spec.is_replicated:  # a look-up: the sub-groups were made before any layer (no collective here)
            self._replica_groups = [
                replica_group(process_group, spec.replica_blocks(s)) if s.num_shards < spec.tp_size else None
                for s in spec.segments
            ]

    @classmethod
    def from_native_module(
        cls,
        module: nn.Linear,
        process_group=None,
        *,
        gather_output: bool = False,
        num_heads: int | None = None,
        head_dim: int | None = None,
        copy_input: bool = True,
        packed: int = 1,
    ) -> Linear1D_Col:
        """Split ``module``'s outputs evenly, or head-wise when ``num_heads`` is given, or each of
        ``packed`` equal parts on its own (a fused ``[gate; up]``: rank ``r`` holds ``[gate_r; up_r]``).

        With ``num_heads`` smaller than the group (key/value heads of grouped-query attention),
        heads are replicated; the group size must then be a multiple of ``num_heads``.
        """
        weight, bias, _, out_features = cls._native(module)
        tp = group_size(process_group)
        if packed > 1:
            part = out_features // packed
            if out_features % packed or part % tp:
                raise ValueError(
                    f"out_features={out_features} of {module} in {packed} packed parts cannot be split over "
                    f"tensor_parallel_size={tp}; use a tensor_parallel_size that divides {part}"
                )
            spec = ShardSpec(dim=0, tp_size=tp, segments=(Segment(part, tp, part),) * packed)
        elif num_heads is None:
            spec = ShardSpec.even(out_features, tp, what=f"out_features of {module}")
        else:
            head_dim = head_dim or out_features // num_heads
            spec = ShardSpec.heads((num_heads,), head_dim, tp)
        if gather_output and (spec.is_replicated or packed > 1):
            raise ValueError("gather_output=True is not supported for replicated heads or packed parts")
        return cls(weight, bias, spec, process_group, gather_output=gather_output, copy_input=copy_input)

    def _weights(self):
        weight, bias = self.weight, self.bias
        if self._replica_groups is not None and torch.is_grad_enabled():  # no gradient, nothing to sum
            if weight.requires_grad:
                weight = _SyncReplicaGrads.apply(weight, self.weight_spec, self._replica_groups)
            if bias is not None and bias.requires_grad:
                bias = _SyncReplicaGrads.apply(bias, self.spec, self._replica_groups)
        return (weight.t() if self.transposed else weight), bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self._weights()
        if self.copy_input:  # with the sequence split: all-gathered along the sequence
            x = enter_region(x, self.process_group, self.sequence)
        y = F.linear(x, weight, bias)
        if self.gather_output:
            y = gather_from_tp(y, self.process_group, dim=-1)
        return y

    def collectives(self) -> dict[str, list[str]]:
        backward = ["all_reduce"] if self.copy_input else []
        if self._replica_groups is not None:  # replicated heads' weight (and bias) gradients are summed
            per = sum(g is not None for g in self._replica_groups)
            backward += ["all_reduce"] * per * (2 if self.bias is not None else 1)
        return {"forward": ["all_gather"] if self.gather_output else [], "backward": backward}

    def collective_bytes(self, tokens: int, itemsize: int) -> dict[str, list[int]]:
        backward = [tokens * self.in_features * itemsize] if self.copy_input else []
        if self._replica_groups is not None:  # each replicated segment's rows of the weight (and bias) gradient
            rows = [seg.shard_len for seg, g in zip(self.spec.segments, self._replica_groups, strict=True) if g]
            size = self.weight.element_size()
            backward += [n * self.in_features * size for n in rows]
            if self.bias is not None:
                backward += [n * size for n in rows]
        gathered = [tokens * self.spec.local_size * itemsize] if self.gather_output else []
        return {"forward": gathered, "backward": backward}

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features} "
            f"(rank {self.tp_rank}/{self.tp_size} holds {self.spec.local_size}), "
            f"bias={self.bias is not None}, gather_output={self.gather_output}"
        )


class FusedLinear1D_Col(Linear1D_Col):
    """Column-parallel linear for a packed projection (e.g. timm's ``qkv``), split per head.

    ``heads=(n_q, n_k, n_v)`` and ``head_dim`` describe the packed output rows; each part is
    split head-wise on its own, never as one contiguous block of rows.
    """

    @classmethod
    def from_native_module(
        cls,
        module: nn.Linear,
        process_group=None,
        *,
        heads: tuple[int, ...],
        head_dim: int,
        gather_output: bool = False,
        copy_input: bool = True,
    ) -> FusedLinear1D_Col:
        weight, bias, _, out_features = cls._native(module)
        if sum(heads) * head_dim != out_features:
            raise ValueError(f"heads={heads} x head_dim={head_dim} does not cover out_features={out_features}")
        spec = ShardSpec.heads(tuple(heads), head_dim, group_size(process_group))
        if gather_output:
            raise ValueError(f"{cls.__name__} cannot gather its packed output; split it per part first")
        return cls(weight, bias, spec, process_group, copy_input=copy_input)


class Linear1D_Row(FromLinear, ParallelModule, nn.Linear):
    """Row-parallel linear: input features split over the group (see the module docstring).

    ``input_is_parallel=False`` takes a full input and keeps this rank's slice of it first.
    ``spec`` splits the input features: dim 1 of ``[out, in]`` weights, or dim 0 when the
    subclass stores ``[in, out]`` weights (``transposed = True``).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        spec: ShardSpec,
        process_group=None,
        *,
        input_is_parallel: bool = True,
    ) -> None:
        super().__init__(process_group)
        in_dim = 0 if self.transposed else 1
        if spec.is_replicated or spec.dim != in_dim:
            raise ValueError(f"{type(self).__name__} needs a split (not replicated) spec along dim {in_dim}")
        self.in_features = spec.full_size
        self.out_features = weight.shape[1 - in_dim]
        self.input_is_parallel = input_is_parallel
        self.spec = spec
        self._shard_param("weight", weight, spec)
        self._shard_param("bias", bias, None)

    @classmethod
    def from_native_module(
        cls,
        module: nn.Linear,
        process_group=None,
        *,
        input_is_parallel: bool = True,
        num_heads: int | None = None,
        head_dim: int | None = None,
    ) -> Linear1D_Row:
        weight, bias, in_features, _ = cls._native(module)
        tp, dim = group_size(process_group), 0 if cls.transposed else 1
        if num_heads is None:
            spec = ShardSpec.even(in_features, tp, dim=dim, what=f"in_features of {module}")
        else:
            spec = ShardSpec.heads((num_heads,), head_dim or in_features // num_heads, tp, dim=dim)
        return cls(weight, bias, spec, process_group, input_is_parallel=input_is_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = split_to_tp(x, self.process_group, dim=-1)
        weight = self.weight.t() if self.transposed else self.weight
        # all-reduce, or reduce-scatter along the sequence (overlapped with the matmul when asked)
        y = linear_leave_region(x, weight, self.process_group, self.sequence)
        return y if self.bias is None else y + self.bias

    def collectives(self) -> dict[str, list[str]]:
        return {"forward": ["all_reduce"], "backward": [] if self.input_is_parallel else ["all_gather"]}

    def collective_bytes(self, tokens: int, itemsize: int) -> dict[str, list[int]]:
        backward = [] if self.input_is_parallel else [tokens * self.spec.local_size * itemsize]
        return {"forward": [tokens * self.out_features * itemsize], "backward": backward}

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features} (rank {self.tp_rank}/{self.tp_size} holds {self.spec.local_size}), "
            f"out_features={self.out_features}, bias={self.bias is not None}"
        )
