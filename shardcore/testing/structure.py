"""Structural checks of a sharded model: its policy's blocks, its parallel modules, each rank's slices."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["check_blocks", "check_sharded_structure", "local_expected"]


def check_blocks(policy, model: nn.Module) -> list[str]:
    """Check ``policy.blocks()`` on ``model``: a non-empty list of ``(name, module)`` pairs, each
    name resolving to its module, none nested in another, in the model's own order. Returns the names."""
    blocks = policy.blocks()
    if not blocks:
        raise AssertionError(f"{type(policy).__name__}.blocks() returned no blocks")
    order = {id(m): i for i, (_, m) in enumerate(model.named_modules())}
    names = []
    for name, module in blocks:
        if model.get_submodule(name) is not module:
            raise AssertionError(f"{type(policy).__name__}.blocks(): {name!r} is not the module it names")
        names.append(name)
    if len(set(names)) != len(names):
        raise AssertionError(f"{type(policy).__name__}.blocks() names a block twice: {names}")
    nested = [(a, b) for a in names for b in names if a != b and b.startswith(a + ".")]
    if nested:
        raise AssertionError(f"{type(policy).__name__}.blocks(): {nested[0][1]!r} is inside {nested[0][0]!r}")
    if [order[id(m)] for _, m in blocks] != sorted(order[id(m)] for _, m in blocks):
        raise AssertionError(f"{type(policy).__name__}.blocks() are not in the model's order: {names}")
    return names


def local_expected(model: nn.Module, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What this rank must hold for each parameter: its ``ShardSpec`` slice of the unsharded
    tensor (replica copies included, padding rows zero), or the whole tensor if replicated."""
    from ..distributed.collectives import group_rank
    from ..sharded_state import parameter_specs

    specs = parameter_specs(model)
    out = {}
    for name, tensor in full.items():
        if name in specs:
            spec, group = specs[name]
            out[name] = spec.shard(tensor, group_rank(group))
        else:
            out[name] = tensor
    return out


def check_sharded_structure(
    model: nn.Module, ref: nn.Module, blocks: list[str], max_fraction: float | None
) -> dict[str, float]:
    """For a model that was sharded: every block of ``Policy.blocks()`` holds parallel modules,
    this rank holds fewer parameter bytes than the unsharded model (at most ``max_fraction`` of
    them, if given), and each local tensor is exactly its slice of the unsharded one."""
    from ..tensor_parallel.parallel_module import ParallelModule

    def split(m: nn.Module) -> bool:  # a parallel layer, or a module whose own parameters were cut in place
        return isinstance(m, ParallelModule) or bool(getattr(m, "shard_specs", None))

    parallel = [type(m).__name__ for m in model.modules() if split(m)]
    if not parallel:
        raise AssertionError("the model was 'sharded' but holds no parallel module: the policy replaced nothing")
    bare = [b for b in blocks if not any(split(m) for m in model.get_submodule(b).modules())]
    if bare:
        raise AssertionError(f"blocks {bare} hold no parallel module: the policy left them whole on every rank")
    local = sum(p.numel() * p.element_size() for p in model.parameters())
    full = sum(p.numel() * p.element_size() for p in ref.parameters())
    if not local < full:
        raise AssertionError(f"this rank holds {local} parameter bytes, no fewer than the unsharded {full}")
    if max_fraction is not None and local > max_fraction * full:
        raise AssertionError(f"this rank holds {local / full:.3f} of the unsharded parameter bytes, > {max_fraction}")
    names, ref_names = {n for n, _ in model.named_parameters()}, {n for n, _ in ref.named_parameters()}
    if names != ref_names:
        raise AssertionError(
            f"parameters differ from the unsharded model's: missing {sorted(ref_names - names)}, extra "
            f"{sorted(names - ref_names)} (a tied weight left untied holds two parameters)"
        )
    expected = local_expected(model, {n: p.detach() for n, p in ref.named_parameters()})
    for name, param in model.named_parameters():
        if param.shape != expected[name].shape or not torch.equal(param.detach(), expected[name]):
            raise AssertionError(f"{name}: this rank's tensor is not its slice of the unsharded parameter")
    return {"parallel_modules": len(parallel), "param_bytes_fraction": local / full}
