"""A native module kept as it is, its own parameters cut in place, its communication in hooks.

What a plan says of a module that is not a plain ``nn.Linear`` / ``nn.Embedding`` (the fused
experts of a mixture-of-experts layer, an attention's per-head parameters) has no parallel layer to
become: :class:`InPlace` keeps the module and its forward, replaces each named parameter by this
rank's slice (recording the :class:`~shardcore.tensor_parallel.ShardSpec`, as a parallel layer does,
so checkpoints, clipping and gradient checks see the full tensor), and adds the collectives a style
asks for as forward hooks on the module itself (they go with the model; nothing global is patched):

* ``"partial"``: the module computes a partial sum from split weights (fused experts cut along
  their intermediate width): its tensor inputs enter the tensor-parallel region (gradient
  all-reduced backward) and its output is summed over the group (all-reduce forward);
* ``"reduce"``: the output is summed over the group (a module whose output is a partial sum);
* ``"scale_input"``: the first input divided by the group size (a module whose output the
  ``"partial"`` module around it sums, although every rank computed it whole);
* ``"tail_grad"``: the output's last ``tail`` features are used on split activations only: their
  gradient is all-reduced backward (MLA's rotary key, which skips the split projection).
"""

from __future__ import annotations

import torch
from torch import nn

from ..distributed.collectives import group_rank, group_size
from .mappings import copy_to_tp, reduce_from_tp
from .shard_spec import Segment, ShardSpec

__all__ = ["InPlace"]

_HOOKS = ("partial", "reduce", "scale_input", "tail_grad")


def _enter(x, group):
    return copy_to_tp(x, group) if isinstance(x, torch.Tensor) and x.is_floating_point() else x


class InPlace:
    """Not a layer: :meth:`from_native_module` changes the native module and returns it (see the module docstring)."""

    @classmethod
    def from_native_module(
        cls,
        module: nn.Module,
        process_group=None,
        *,
        params: dict[str, tuple[int, int]] | None = None,
        hook: str | None = None,
        tail: int = 0,
        where: str = "",
    ) -> nn.Module:
        """Cut ``params`` (``{name: (dim, parts)}``: split along ``dim``, each of ``parts`` equal packed
        segments on its own) to this rank's slice and install ``hook`` (one of ``"partial"``,
        ``"reduce"``, ``"scale_input"``, ``"tail_grad"``). ``where`` names the module in errors."""
        tp, rank = group_size(process_group), group_rank(process_group)
        if params:
            if not hasattr(module, "shard_specs"):
                module.shard_specs = {}
            module.process_group = process_group
        for name, (dim, parts) in (params or {}).items():
            param = module._parameters[name]
            size = param.shape[dim]
            if size % parts or (size // parts) % tp:
                packed = f" ({parts} packed parts of {size // parts})" if parts > 1 else ""
                raise ValueError(
                    f"{where}.{name}: dimension {dim} of size {size}{packed} cannot be split into {tp} equal "
                    f"parts; use a tensor_parallel_size that divides {size // parts}"
                )
            spec = ShardSpec(dim=dim, tp_size=tp, segments=(Segment(size // parts, tp, size // parts),) * parts)
            module._parameters[name] = nn.Parameter(spec.shard(param.detach(), rank), requires_grad=param.requires_grad)
            module.shard_specs[name] = spec
        if hook is None or tp == 1:
            return module
        if hook not in _HOOKS:
            raise ValueError(f"{where}: unknown in-place hook {hook!r}; one of {', '.join(_HOOKS)}")
        group = process_group
        if hook == "partial":

            def enter(mod, args, kwargs):
                args = tuple(_enter(a, group) for a in args)
                return args, {k: _enter(v, group) for k, v in kwargs.items()}

            module.register_forward_pre_hook(enter, with_kwargs=True)
            module.register_forward_hook(lambda mod, args, out: reduce_from_tp(out, group))
        elif hook == "reduce":
            module.register_forward_hook(lambda mod, args, out: reduce_from_tp(out, group))
        elif hook == "scale_input":
            module.register_forward_pre_hook(lambda mod, args: (args[0] / tp, *args[1:]))
        else:  # tail_grad

            def tail_grad(mod, args, out):
                head, end = out.split([out.shape[-1] - tail, tail], dim=-1)
                return torch.cat([head, copy_to_tp(end, group)], dim=-1)

            module.register_forward_hook(tail_grad)
        return module
