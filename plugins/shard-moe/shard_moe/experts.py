"""The experts of a mixture-of-experts layer split over the tensor-parallel group.

transformers 5 keeps a layer's experts in one module with fused 3-D weights (``gate_up_proj``
``[E, 2I, H]``, ``down_proj`` ``[E, H, I]``) whose forward takes the hidden states, each token's
chosen experts (``top_k_index``) and their weights, and skips the index ``E`` (the sentinel its
own expert parallelism routes foreign tokens to). :class:`ExpertsTP` keeps experts
``[r * E / tp, (r + 1) * E / tp)`` on rank ``r`` and runs the module's own forward on them: a
token's choices of other ranks' experts become the sentinel (weight 0), so each rank adds its
experts' share and one all-reduce sums the shares (HuggingFace's ``moe_tp_experts`` layout; the
router stays replicated). The hidden states and routing weights enter the region through
Megatron's *f*: their gradients, each rank's experts' share, are summed in the backward.
"""

from __future__ import annotations

import torch
from torch import nn

from shardcore.tensor_parallel import ParallelModule, copy_to_tp, reduce_from_tp
from shardcore.tensor_parallel.shard_spec import ShardSpec

_KEEP_OUT = {"_parameters", "_buffers", "_modules", "training"}
_CLASSES: dict[type, type] = {}


def _tp_class(native: type) -> type:
    """``ExpertsTP`` over ``native`` (``MixtralExperts``...): the native class's methods (the
    kernels its forward dispatches to call them) and ``isinstance`` checks hold. Made once per
    native class and named in this module (``shard_moe.experts.<Native>TP``); pickling a sharded
    model is not tested (save its weights: ``save_checkpoint``, ``save_pretrained``)."""
    cls = _CLASSES.get(native)
    if cls is None:
        cls = type(f"{native.__name__}TP", (ExpertsTP, native), {"__module__": __name__})
        _CLASSES[native] = globals()[cls.__name__] = cls
    return cls


class ExpertsTP(ParallelModule):
    """This rank's experts of a fused experts module; its forward is the native module's."""

    @classmethod
    def from_native_module(cls, module: nn.Module, process_group=None, **kwargs) -> ExpertsTP:
        new = _tp_class(type(module))(process_group)
        experts, tp = module.num_experts, new.tp_size
        if experts % tp:
            raise ValueError(
                f"{type(module).__name__}: {experts} experts do not split over tensor_parallel_size={tp}; "
                f"use a tensor_parallel_size that divides {experts}"
            )
        for key, value in vars(module).items():  # the native forward's attributes (act_fn, config, flags)
            if key not in _KEEP_OUT:
                new.__dict__[key] = value
        new._modules.update(module._modules)
        new.native = type(module)
        new.train(module.training)
        for name in ("gate_up_proj", "down_proj"):
            full = getattr(module, name)
            new._shard_param(name, full, ShardSpec.even(experts, tp, dim=0, what=f"{name} experts"))
        new.num_experts = experts // tp
        new.total_experts = experts
        new._is_expert_parallel = True  # transformers' batched kernels then mask the sentinel too
        return new

    def collectives(self) -> dict[str, list[str]]:
        return {"forward": ["all_reduce"], "backward": ["all_reduce", "all_reduce"]}

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, **kwargs):
        group, local = self.process_group, self.num_experts
        index = top_k_index - self.tp_rank * local
        mine = (index >= 0) & (index < local)
        index = torch.where(mine, index, local)  # another rank's expert: the sentinel, skipped
        weights = torch.where(mine, copy_to_tp(top_k_weights, group), 0.0)
        out = self.native.forward(self, copy_to_tp(hidden_states, group), index, weights, **kwargs)
        return reduce_from_tp(out, group)

    def extra_repr(self) -> str:
        return f"experts {self.tp_rank * self.num_experts}..{(self.tp_rank + 1) * self.num_experts - 1} of {self.total_experts}"
