"""Megatron's ``split_gather`` region of a plan: whether the blocks a plan shards keep every token
mixing inside a column-/row-parallel pair.

Under ``split_gather`` each rank holds ``1/tp`` of the tokens between the pairs; a column-parallel
layer gathers the whole sequence on entry, the row-parallel layer after it scatters it again. That is
exact when what runs outside the pairs is token-wise: norms, residual sums, a linear layer's output
only ever entering the pairs. Attention mixes tokens; it is inside a pair when its projections are
split. A plan that leaves a projection whole, shards a layer with a style that does not gather the
sequence (fused experts), or a block holding a parameterised module that is neither a norm nor a
planned linear layer (a convolution over the tokens, a recurrence) would run on a rank's tokens
alone and give other numbers with the same shapes: such a block is refused, by name.
"""

from __future__ import annotations

from torch import nn

__all__ = ["region_entries", "region_problem"]


def region_problem(blocks: list[tuple[str, nn.Module]], plans: dict, grad_sum=()) -> str | None:
    """Why ``split_gather`` cannot follow the plan's layers ``plans`` (``{module path: (layer class,
    kwargs, key)}``) in ``blocks`` (``None``: every block keeps token mixing inside its pairs).
    ``grad_sum``: the replicated parameters the plan sums over the group (applied to a rank's heads)."""
    if not blocks:
        return "sequence_parallelism_mode='split_gather': the plan shards no repeated blocks to split the sequence over"
    for name, block in blocks:
        inside = {p: layer[0] for p, layer in plans.items() if p.startswith(f"{name}.")}
        problem = _block_problem(name, block, inside, set(grad_sum))
        if problem:
            return problem
    return None


def _block_problem(name: str, block: nn.Module, inside: dict, grad_sum: set) -> str | None:
    from ..tensor_parallel import Linear1D_Col, Linear1D_Row

    other = {p: c.__name__ for p, c in inside.items() if c not in (Linear1D_Col, Linear1D_Row)}
    if other:
        path, cls = next(iter(other.items()))
        return f"{path} is planned as {cls}, which does not gather the split sequence; no region is declared for it"
    if Linear1D_Col not in inside.values() or Linear1D_Row not in inside.values():
        return f"{name} holds no column- and row-parallel pair in the plan: its token mixing would see a rank's tokens"
    entries = {p.rpartition(".")[0] for p, c in inside.items() if c is Linear1D_Col}
    for path, module in block.named_modules():
        full = f"{name}.{path}" if path else name
        own = [f"{full}.{n}" for n, _ in module.named_parameters(recurse=False)]
        if full in inside or not own:
            continue
        kind = type(module).__name__
        if isinstance(module, nn.Linear) or "norm" not in kind.lower():
            return (
                f"{full} ({kind}) is not split by the plan and is not a norm: under split_gather it would run on a "
                "rank's tokens alone; no region is declared for it"
            )
        entry = next((e for e in entries if full.startswith(f"{e}.")), None)
        if entry is not None and not set(own) <= grad_sum:  # inside a region, its tokens gathered or not?
            return (
                f"{full} ({kind}) sits in {entry}, which gathers the sequence, and the plan neither splits nor sums it: "
                "whether it sees every token or a rank's cannot be told; no region is declared for it"
            )
    return None


def region_entries(subs: list, blocks: list[tuple[str, nn.Module]]) -> tuple[list[str], list]:
    """``(modules entering the region, the replacements)`` under ``split_gather``: each column-parallel
    layer's parent module (an attention, an MLP) gathers the sequence at its input, so everything in it
    (a view by the input's length, rotary embeddings over the whole sequence) sees every token, and its
    column-parallel layers read that input as it is (``copy_input=False``). The row-parallel layers
    scatter it again. Only layers inside ``blocks`` (the split's region); the head reads whole states."""
    import attrs

    from ..tensor_parallel import Linear1D_Col

    names = [name for name, _ in blocks]  # a column layer outside the blocks (the head) reads whole states
    parents = (s.suffix.rpartition(".")[0] for s in subs if s.target_module is Linear1D_Col)
    entries = list(dict.fromkeys(p for p in parents if any(p.startswith(f"{n}.") for n in names)))
    inside = [
        attrs.evolve(s, kwargs={**s.kwargs, "copy_input": False})
        if s.target_module is Linear1D_Col and s.suffix.rpartition(".")[0] in entries
        else s
        for s in subs
    ]
    return entries, inside
