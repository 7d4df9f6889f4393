"""``ParallelModule``: the base of every layer that holds a slice of a native module."""

from __future__ import annotations

import torch
from torch import nn

from ..distributed.collectives import group_rank, group_size
from .shard_spec import ShardSpec

__all__ = ["ParallelModule"]


class ParallelModule(nn.Module):
    """A module holding this rank's slice of a native module's parameters.

    Subclasses implement :meth:`from_native_module`, a named constructor that takes the native
    module's weights (never re-initialising them), and record in ``shard_specs`` how each of
    their split parameters maps onto the full one (parameters without a spec are replicated).
    """

    def __init__(self, process_group=None) -> None:
        nn.Module.__init__(self)  # not the next class in the MRO: parallel linears are also nn.Linear
        self.process_group = process_group
        self.tp_size = group_size(process_group)
        self.tp_rank = group_rank(process_group)
        self.shard_specs: dict[str, ShardSpec] = {}
        #: The model's sequence split (:class:`~shardcore.tensor_parallel.regions.SequenceParallel`) when this
        #: layer runs inside a block under sequence parallelism: its TP-region input is then
        #: all-gathered along the sequence and its partial sums reduce-scattered.
        self.sequence = None

    def collectives(self) -> dict[str, list[str]]:
        """The collectives one call of this layer issues over its group: ``{"forward": [...],
        "backward": [...]}`` (kinds such as ``"all_reduce"``). Read by ``shardcore explain``; the
        plugins' collective-count tests check it against what a real step issues."""
        return {"forward": [], "backward": []}

    def collective_bytes(self, tokens: int, itemsize: int) -> dict[str, list[int]] | None:
        """The bytes this rank puts into each of :meth:`collectives` (same order) when the layer
        runs on ``tokens`` tokens of ``itemsize``-byte activations; ``None``: not known ahead (it
        depends on the data, or the layer does not say). Read by ``shardcore explain --seq``."""
        return None

    @classmethod
    def from_native_module(cls, module: nn.Module, process_group=None, **kwargs) -> ParallelModule:
        raise NotImplementedError(f"{cls.__name__} does not implement from_native_module")

    @classmethod
    def _expect_native(cls, module: nn.Module, expected: type) -> None:
        if not isinstance(module, expected):
            raise TypeError(
                f"{cls.__name__}.from_native_module expects {expected.__module__}.{expected.__name__}, "
                f"got {type(module).__name__}"
            )

    def _shard_param(
        self, name: str, full: torch.Tensor | None, spec: ShardSpec | None, *, requires_grad: bool | None = None
    ) -> None:
        """Register parameter ``name`` as this rank's slice of ``full`` under ``spec`` (``None``: replicated);
        it requires grad as ``full`` does unless ``requires_grad`` says (a frozen weight stays frozen)."""
        if full is None:
            self.register_parameter(name, None)
            return
        data = full.detach() if spec is None else spec.shard(full.detach(), self.tp_rank)
        if spec is None and data.device.type != "meta":
            data = data.clone()
        grad = full.requires_grad if requires_grad is None else requires_grad
        self.register_parameter(name, nn.Parameter(data, requires_grad=grad))
        if spec is not None:
            self.shard_specs[name] = spec
