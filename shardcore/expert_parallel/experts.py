"""The experts of a mixture-of-experts layer split over the tensor-parallel group (:class:`ExpertsTP`) or
over the expert-parallel and tensor-parallel ranks (:class:`ExpertsEP`): the core's layers, over the
experts module convention of transformers 5; a plugin names which module holds a model's experts.

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

from ..distributed.collectives import all_gather_cat, group_rank, group_size
from ..tensor_parallel import ParallelModule, copy_to_tp, reduce_from_tp
from ..tensor_parallel.regions import gather_seq, scatter_seq
from ..tensor_parallel.shard_spec import ShardSpec
from . import route

_KEEP_OUT = {"_parameters", "_buffers", "_modules", "training"}
_CLASSES: dict[tuple[type, type], type] = {}


def _over(native: type, base: type) -> type:
    """``base`` (``ExpertsTP``, ``ExpertsEP``) over ``native`` (``MixtralExperts``...): the native
    class's methods (the kernels its forward dispatches to call them) and ``isinstance`` checks
    hold. Made once per pair and named in this module (``shardcore.expert_parallel.experts.<Native>TP``, ``...EP``);
    pickling a sharded model is not tested (save its weights: ``save_checkpoint``, ``save_pretrained``)."""
    cls = _CLASSES.get((native, base))
    if cls is None:
        suffix = base.__name__.removeprefix("Experts")
        cls = type(f"{native.__name__}{suffix}", (base, native), {"__module__": __name__})
        _CLASSES[native, base] = globals()[cls.__name__] = cls
    return cls


def _take(new: nn.Module, module: nn.Module, parts: int, why: str) -> None:
    """``new`` takes ``module``'s attributes and its ``E / parts`` experts of rank ``new.tp_rank``."""
    experts = module.num_experts
    if experts % parts:
        raise ValueError(f"{type(module).__name__}: {experts} experts do not split over {why}")
    for key, value in vars(module).items():  # the native forward's attributes (act_fn, config, flags)
        if key not in _KEEP_OUT:
            new.__dict__[key] = value
    new._modules.update(module._modules)
    new.native = type(module)
    new.train(module.training)
    for name, full in list(module.named_parameters(recurse=False)):  # each one slice per expert (biases too)
        if full.shape[:1] != (experts,):
            raise ValueError(
                f"{type(module).__name__}.{name} {list(full.shape)} does not hold one slice per expert of {experts}: "
                "the experts cannot be split whole; shard this model without expert parallelism"
            )
        new._shard_param(name, full, ShardSpec.even(experts, parts, dim=0, what=f"{name} experts"))
    new.num_experts = experts // parts
    new.total_experts = experts


class ExpertsTP(ParallelModule):
    """This rank's experts of a fused experts module; its forward is the native module's."""

    @classmethod
    def from_native_module(cls, module: nn.Module, process_group=None, **kwargs) -> ExpertsTP:
        new = _over(type(module), ExpertsTP)(process_group)
        tp = new.tp_size
        _take(new, module, tp, f"tensor_parallel_size={tp}; use a tensor_parallel_size that divides them")
        new._is_expert_parallel = True  # transformers' batched kernels then mask the sentinel too
        return new

    def collectives(self) -> dict[str, list[str]]:
        return {"forward": ["all_reduce"], "backward": ["all_reduce", "all_reduce"]}

    def collective_bytes(self, tokens: int, itemsize: int) -> dict[str, list[int]]:
        hidden = tokens * self.config.hidden_size * itemsize
        top_k = self.config.num_experts_per_tok
        return {"forward": [hidden], "backward": [hidden, tokens * top_k * itemsize]}  # the routing weights' too

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, **kwargs):
        group, local = self.process_group, self.num_experts
        sequence = getattr(self, "sequence", None)
        if sequence is not None and sequence.active and self.tp_size > 1:
            return self._split_forward(hidden_states, top_k_index, top_k_weights, **kwargs)
        index = top_k_index - self.tp_rank * local
        mine = (index >= 0) & (index < local)
        index = torch.where(mine, index, local)  # another rank's expert: the sentinel, skipped
        weights = torch.where(mine, copy_to_tp(top_k_weights, group), 0.0)
        out = self.native.forward(self, copy_to_tp(hidden_states, group), index, weights, **kwargs)
        return reduce_from_tp(out, group)

    def _split_forward(self, hidden, top_k_index, top_k_weights, **kwargs):
        """Under Megatron's split each rank routes its own tokens (rows): every rank's rows are gathered,
        each rank's experts serve them all, and each rank gets its own rows' sums back (reduce-scatter)."""
        group, local = self.process_group, self.num_experts
        where = "the experts' tokens (sequence split)"
        index = all_gather_cat(top_k_index.contiguous(), group, 0, where=where) - self.tp_rank * local
        mine = (index >= 0) & (index < local)
        weights = torch.where(mine, gather_seq(top_k_weights.contiguous(), group, 0), 0.0)
        out = self.native.forward(
            self, gather_seq(hidden.contiguous(), group, 0), torch.where(mine, index, local), weights, **kwargs
        )
        return scatter_seq(out, group, 0)

    def extra_repr(self) -> str:
        return f"experts {self.tp_rank * self.num_experts}..{(self.tp_rank + 1) * self.num_experts - 1} of {self.total_experts}"


class ExpertsEP(ParallelModule):
    """This rank's experts under expert parallelism (``ShardConfig(expert_parallel_size=E)``).

    The ``E x tp`` ranks of the experts' group hold ``E_total / (E x tp)`` whole experts each (rank
    ``e * tp + t``: expert-parallel rank ``e``, tensor-parallel rank ``t``). Each tensor-parallel
    rank routes the choices of its own tokens whose experts sit on tensor-parallel rank ``t`` of
    some expert-parallel rank to that rank (:func:`shardcore.expert_parallel.route`, all-to-all over
    the ``E`` ranks); there the native forward runs the received tokens through their experts
    (weight 1), the outputs come back, are weighted by the router and summed per token, and one
    all-reduce over the tensor-parallel group adds the shares its ranks computed (as ``ExpertsTP``).
    """

    expert_parallel = True

    @classmethod
    def from_native_module(cls, module: nn.Module, process_group=None, *, layout=None, **kwargs) -> ExpertsEP:
        ep_group, experts_group, _ = layout.built_expert_groups()  # made by optimize before any layer
        new = _over(type(module), ExpertsEP)(experts_group)  # the specs' group: one copy of every expert
        parts = new.tp_size
        _take(
            new,
            module,
            parts,
            f"expert_parallel_size={layout.ep} x tensor_parallel_size={layout.tp} ranks; "
            "choose sizes whose product divides them",
        )
        new.tp_group, new.ep_group = process_group, ep_group
        new.inner_tp, new.inner_rank = group_size(process_group), group_rank(process_group)
        return new

    def traffic(self, tokens: int, itemsize: int) -> dict[str, int]:
        """Bytes one forward / backward of this layer sends from a rank, for ``tokens`` tokens on its
        data-parallel rank, the choices spread evenly: of this tensor-parallel rank's share of the
        ``tokens x top_k`` choices, ``(ep - 1) / ep`` leave, and as many come back."""
        hidden, ep = self.config.hidden_size, group_size(self.ep_group)
        rows = tokens * self.config.num_experts_per_tok // self.inner_tp * (ep - 1) // ep
        counts = ep * self.num_experts * 8
        return {"forward": 2 * rows * hidden * itemsize + counts, "backward": 2 * rows * hidden * itemsize}

    def collectives(self) -> dict[str, list[str]]:
        tp = ["all_reduce"] if self.inner_tp > 1 else []
        return {"forward": ["all_to_all"] * 3 + tp, "backward": ["all_to_all"] * 2 + tp * 2}

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, **kwargs):
        group, per, tp = self.tp_group, self.num_experts, self.inner_tp
        x, weights = copy_to_tp(hidden_states, group), copy_to_tp(top_k_weights, group)
        top_k = top_k_index.shape[-1]
        block = (top_k_index // per).flatten()  # the experts' group rank holding each choice's expert
        ep_rank, mine = block // tp, block % tp == self.inner_rank
        outside = group_size(self.ep_group) * per  # another tensor-parallel rank's choice: left unrouted
        key = torch.where(mine, ep_rank * per + top_k_index.flatten() % per, outside)
        received, expert, back = route(x, key, per, self.ep_group, fanout=top_k)
        ones = received.new_ones((received.shape[0], 1))
        out = self.native.forward(self, received, expert[:, None], ones, **kwargs)
        # a rank none of whose experts was chosen still has (zero) gradients, as the fused unsharded weights do (every
        # weight of the experts: Nemotron-H's up_proj without a gate, GPT-OSS's biases)
        out = out + sum(p.reshape(-1)[:0].sum() for p in self.parameters(recurse=False))
        mixed = back(out) * weights.reshape(-1, 1).to(out.dtype)
        y = mixed.view(-1, top_k, mixed.shape[-1]).sum(1).to(hidden_states.dtype)
        return reduce_from_tp(y, group)

    def extra_repr(self) -> str:
        first = self.tp_rank * self.num_experts
        return f"experts {first}..{first + self.num_experts - 1} of {self.total_experts} (expert parallel)"
