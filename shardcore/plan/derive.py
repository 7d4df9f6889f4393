"""A plan derived from a model's modules, for a model with neither a plugin nor a shipped plan.

``ShardConfig(plan="derive")`` (opt-in): in the first block of the model's repeated blocks (its
largest ``nn.ModuleList``, or ``nn.Sequential`` of two or more, of one class: torchvision's encoders),
every module holding plain ``nn.Linear`` children is read:

* an attention (a module with an integer ``head_dim`` and a head count): the linears reading the
  hidden width and writing whole heads are split by heads (column), the one reading heads and
  writing the hidden width by its input (row), when there is exactly one such;
* an MLP (any other module): the linears reading the hidden width and writing one other width
  ``I`` are split column-wise, the one reading ``I`` and writing the hidden width row-wise, when
  there is exactly one such;

everything else stays whole (a packed ``qkv`` whose packing cannot be read from shapes, a gate,
a norm), and the embedding and the head are split over the vocabulary. The plan is then applied
as any plan, and checked as any plan shardcore did not write (``ShardConfig.verify``, on by
default): a block whose output or gradients differ refuses it at ``optimize``, naming the block.
"""

from __future__ import annotations

import re
from collections import Counter

from torch import nn

from .flow import repeated
from .syntax import PlanError

#: ``ShardConfig(plan=DERIVE)``: derive the plan from the model's modules
DERIVE = "derive"

_HEADS = ("num_heads", "num_attention_heads")


def _plain(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward


def _blocks(model: nn.Module) -> tuple[str, nn.Module] | None:
    """The model's repeated blocks: its largest repeated container whose children share one class."""
    found = [
        (name, mod)
        for name, mod in model.named_modules()
        if repeated(mod) and len({type(b) for b in mod}) == 1 and any(_plain(m) for m in mod[0].modules())
    ]
    return max(found, key=lambda f: sum(p.numel() for p in f[1].parameters()), default=None)


def _split(holder: nn.Module, hidden: int) -> tuple[list[str], str] | None:
    """``(column children, row child)`` of one module, or ``None`` if it is not an attention or MLP pair."""
    linears = {n: m for n, m in holder.named_children() if _plain(m)}
    head_dim = getattr(holder, "head_dim", None)
    heads = next((getattr(holder, a) for a in _HEADS if isinstance(getattr(holder, a, None), int)), None)
    if isinstance(head_dim, int) and heads:  # an attention: whole heads on each side
        cols = [n for n, m in linears.items() if m.in_features == hidden and m.out_features % head_dim == 0]
        rows = [n for n, m in linears.items() if m.out_features == hidden and m.in_features == heads * head_dim]
        rows = [n for n in rows if n not in cols]
    else:
        widths = Counter(
            m.out_features for m in linears.values() if m.in_features == hidden and m.out_features != hidden
        )
        if len(widths) != 1:
            return None
        (inner,) = widths
        cols = [n for n, m in linears.items() if m.in_features == hidden and m.out_features == inner]
        rows = [n for n, m in linears.items() if m.in_features == inner and m.out_features == hidden]
    if not cols or len(rows) != 1 or len(cols) + 1 != len(linears):
        return None  # a linear the pair does not explain (a packed qkv, a gate): the module stays whole
    return cols, rows[0]


def derived_plan(model: nn.Module) -> dict[str, list]:
    """The plan (see the module docstring); :class:`PlanError` saying what was found when nothing splits."""
    found = _blocks(model)
    name = type(model).__name__
    if found is None:
        raise PlanError(
            f"{name}: no repeated blocks (an nn.ModuleList or nn.Sequential of one class holding nn.Linear layers) to derive a plan from"
        )
    path, blocks = found
    config = getattr(model, "config", None)
    hidden = getattr(config, "hidden_size", None)
    if not isinstance(hidden, int):
        widths = Counter(m.in_features for m in blocks[0].modules() if _plain(m))
        hidden = widths.most_common(1)[0][0]
    specs: dict[str, list] = {}
    for rel, holder in blocks[0].named_modules():
        pair = _split(holder, hidden)
        if pair is None:
            continue
        cols, row = pair
        each = re.sub(r"\d+$", "*", next(n for n, _ in blocks.named_children()))  # "*", or "encoder_layer_*"
        block = f"{path}.{each}" if path else each  # (the model itself may be the Sequential)
        prefix = f"{block}.{rel}." if rel else f"{block}."
        for col in cols:
            specs[f"{prefix}{col}.weight"] = ["tp", None]
        specs[f"{prefix}{row}.weight"] = [None, "tp"]
    if not specs:
        raise PlanError(
            f"{name}: no attention (heads of a head_dim) or MLP pair (hidden -> I -> hidden) of plain nn.Linear "
            f"layers found in {path}.0 ({type(blocks[0]).__name__}); write a plan or a plugin"
        )
    from .zero_config import split_ends

    split_ends(model, specs)
    return specs


def derived_policy(model: nn.Module):
    """``ShardConfig(plan="derive")``: a :class:`~shardcore.plan.PlanPolicy` of :func:`derived_plan`."""
    from .policy import PlanPolicy
    from .syntax import _Plan

    specs = derived_plan(model)
    return PlanPolicy(_Plan(specs, {}, f"the plan derived from {type(model).__name__}'s modules"))
