"""Weights a pipeline holds on several stages (tied embeddings): which ranks sum their gradients."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from ..distributed.groups import new_group


def _tied(model: nn.Module, blocks: list, end_stage: dict[str, int], stage_of_block: dict[int, int], owner) -> tuple:
    """``({id(param): the pp ranks whose stages hold one of its names}, {name: its other names})``
    for parameters the unsharded model holds under several names (tied embeddings): their
    gradients are summed over the ranks of those stages. ``owner(stage)``: the pp rank running it."""
    names_of: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(n)

    def stage_of(param_name: str) -> int | None:
        for path, stage in end_stage.items():
            if param_name == path or param_name.startswith(path + "."):
                return stage
        for b, (block_name, _) in enumerate(blocks):
            if param_name.startswith(block_name + "."):
                return stage_of_block[b]
        return None  # outside blocks and ends: every stage has it

    owners_of = {}
    for pid, names in names_of.items():
        stages = {stage_of(n) for n in names}
        if len(names) > 1 and None not in stages:
            owners = tuple(sorted({owner(t) for t in stages}))
            if len(owners) > 1:
                owners_of[pid] = owners
    aliases = {n: [m for m in names if m != n] for names in names_of.values() if len(names) > 1 for n in names}
    return owners_of, aliases


def _tied_groups(model: nn.Module, layout, owners_of: dict) -> list:
    """The ranks holding a tied parameter's stages sum its gradients: one group per (dp, sp, tp)
    coordinate (collective over the world: every rank creates every group, in one order)."""
    if not owners_of:
        return []
    coords = [layout.coordinates(r) for r in range(dist.get_world_size())]
    keys = sorted({(c["dp"], c["sp"], c["tp"]) for c in coords})
    groups = {}
    for owners in sorted(set(owners_of.values())):
        for key in keys:
            ranks = sorted(r for r, c in enumerate(coords) if (c["dp"], c["sp"], c["tp"]) == key and c["pp"] in owners)
            g = new_group(ranks)
            if dist.get_rank() in ranks:
                groups[owners] = g
    live = {id(p): n for n, p in model.named_parameters()}  # by name: data parallelism replaces the objects
    return [(live[pid], groups[owners]) for pid, owners in owners_of.items() if pid in live]
