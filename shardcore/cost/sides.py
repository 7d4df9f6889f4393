"""Which sides of a tensor-parallel matmul a token leaves for the backward (the cost model's activations,
:mod:`shardcore.cost.facts`): read off the layers' column- and row-parallel roles and their siblings' shapes.
Model-agnostic: no class of a model is named."""

from __future__ import annotations

from torch import nn

from ..tensor_parallel.linear import Linear1D_Col, Linear1D_Row


def matmul_sides(model: nn.Module, roles: dict[int, str] | None = None) -> dict[int, tuple[int, int]]:
    """Per tensor-parallel linear (by ``id``): ``(elements a token leaves with it for the backward, of those the
    region's edge)``. A column-parallel layer keeps its input, unless the column-parallel sibling before it reads
    the same one (q, k and v; gate and up: as wide, one tensor kept once), and its output; of two such siblings as
    wide out (a gated unit) the activation's output is kept too, for the product's backward. A row-parallel layer
    keeps its input; its output goes into the residual sum, which keeps nothing. The region's edge: a column-parallel
    layer's input. ``roles``: ``{id(module): "col" | "row"}`` of a model not sharded (TP=1: the policy's plan,
    :func:`planned_roles`); else the layers' classes."""
    out: dict[int, tuple[int, int]] = {}
    for parent in model.modules():
        run: list[nn.Linear] = []
        for child in parent.children():
            role = (roles or {}).get(id(child)) or _role(child)
            if role is None or not isinstance(child, nn.Linear):
                continue
            shared = role == "col" and bool(run) and run[-1].weight.shape[1] == child.weight.shape[1]
            run = [*run, child] if shared else ([child] if role == "col" else [])
            width, rows = child.weight.shape[1], child.weight.shape[0]
            out[id(child)] = (rows + (0 if shared else width), 0 if shared else width) if role == "col" else (width, 0)
            if len(run) == 2 and run[0].weight.shape[0] == rows:  # gated: a third (see below) makes it attention's
                out[id(child)] = (out[id(child)][0] + rows, 0)
            elif len(run) == 3 and run[0].weight.shape[0] == run[1].weight.shape[0]:
                out[id(run[1])] = (run[1].weight.shape[0], 0)  # q, k, v: not a gated pair after all
    return out


def _role(module: nn.Module) -> str | None:
    if isinstance(module, Linear1D_Col):
        return "col"
    return "row" if isinstance(module, Linear1D_Row) else None


def planned_roles(model: nn.Module, policy) -> dict[int, str]:
    """The column- and row-parallel roles ``policy``'s plan gives ``model``'s linears where it is not sharded
    (TP=1), by ``id``; none where the plan cannot be made on it."""
    from ..sharder import ModelSharder

    roles: dict[int, str] = {}
    try:
        plan = ModelSharder(model, policy, None).plan()
    except (AttributeError, ValueError, NotImplementedError, TypeError):
        return roles  # each matmul's input and output counted, as for a model without a policy
    for _, module, desc in plan:
        for sub in desc.sub_module_replacement:
            kind = "col" if issubclass(sub.target_module, Linear1D_Col) else None
            kind = kind or ("row" if issubclass(sub.target_module, Linear1D_Row) else None)
            try:
                target = module.get_submodule(sub.suffix)
            except AttributeError:  # an optional one the module lacks (``ignore_if_not_exist``)
                continue
            if kind:
                roles[id(target)] = kind
    return roles
