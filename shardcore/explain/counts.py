"""What ``shardcore explain`` counts on the sharded paper model: bytes per module and stage, collectives."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import attrs
from torch import nn

from ..config import ShardConfig
from ..tensor_parallel.linear import Linear1D_Col
from ..tensor_parallel.parallel_module import ParallelModule

_LAYER_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


def _pattern(name: str) -> str:
    return _LAYER_INDEX.sub("*", name)


def _nbytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def _valid_tp_sizes(policy, config: ShardConfig, limit: int = 64) -> list[int]:
    valid = []
    for t in range(1, limit + 1):
        policy.set_shard_config(attrs.evolve(config, tensor_parallel_size=t), t)
        try:
            policy.config_sanity_check()
        except (ValueError, NotImplementedError):
            continue
        valid.append(t)
    return valid


def _stage_bytes(model: nn.Module, blocks: list[str], pp: int) -> list[int]:
    """Bytes each pipeline stage would hold: ``blocks`` split evenly (earlier stages take the
    remainder), what comes before the first block on the first stage, the rest on the last; a
    tied parameter counts on every stage that holds one of its aliases (embedding and head)."""
    per = [len(blocks) // pp + (1 if s < len(blocks) % pp else 0) for s in range(pp)]
    block_stage, i = {}, 0
    for s, n in enumerate(per):
        for b in blocks[i : i + n]:
            block_stage[b] = s
        i += n
    held: list[set[int]] = [set() for _ in range(pp)]
    stages, seen_block = [0] * pp, False
    for name, module in model.named_modules(remove_duplicate=False):
        owner = next((b for b in blocks if name == b or name.startswith(b + ".")), None)
        if owner is not None:
            stage, seen_block = block_stage[owner], True
        else:
            stage = pp - 1 if seen_block else 0
        for p in module.parameters(recurse=False):
            if id(p) not in held[stage]:
                held[stage].add(id(p))
                stages[stage] += p.numel() * p.element_size()
    return stages


def _module_rows(model: nn.Module) -> dict[tuple[str, str], dict[str, Any]]:
    """Per module pattern (``model.layers.*.mlp``) and class: its replacement and rank-0 bytes."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    owners = {}
    for mod_name, module in model.named_modules():
        own = list(module.parameters(recurse=False))
        if not own:
            continue
        parallel = isinstance(module, ParallelModule)
        key = (_pattern(mod_name), type(module).__name__)
        row = rows.setdefault(
            key,
            {
                "pattern": key[0],
                "module": key[1],
                "parallel": parallel,
                "count": 0,
                "bytes_per_rank": 0,
                "detail": module.extra_repr() if parallel else "replicated",
                "collectives": module.collectives() if parallel else {"forward": [], "backward": []},
            },
        )
        row["count"] += 1
        for p_name, p in module.named_parameters(recurse=False):
            if id(p) not in owners:  # tied parameters count once
                owners[id(p)] = f"{mod_name}.{p_name}" if mod_name else p_name
                row["bytes_per_rank"] += p.numel() * p.element_size()
    return rows


def shares_parent_copy(policy, name: str, module, copied: set[str]) -> bool:
    """Under ``TensorParallelSpec.share_copies``, whether column layer ``name`` reads the input an earlier column layer
    of its parent already copied into the region (one shared copy: its backward all-reduce counted
    once, not again here); records the parent in ``copied``."""
    if not (policy.tensor_parallel().share_copies and isinstance(module, Linear1D_Col) and module.copy_input):
        return False
    parent = name.rpartition(".")[0]
    shared = parent in copied
    copied.add(parent)
    return shared


def _collective_counts(build, block_names: list[str], block_cls: dict[str, str]):
    """Collectives per block class, outside the blocks, and per training step (forward, backward)."""
    model, policy, config = build.model, build.policy, build.config
    sharded_by_tp = build.tensor_parallel or build.expert_parallel
    entries = [(name, desc) for name, _, desc in build.plan or []]

    def inside(name: str) -> str | None:
        return next((b for b in block_names if name == b or name.startswith(b + ".")), None)

    per_block: dict[str, Counter] = {}
    outside = {"forward": Counter(), "backward": Counter()}
    counts_by_block: dict[str, dict[str, Counter]] = {}
    if sharded_by_tp:
        copied: set[str] = set()  # parents whose column layers already entered the region
        for mod_name, module in model.named_modules():
            if isinstance(module, ParallelModule):
                block = inside(mod_name)
                target = (
                    counts_by_block.setdefault(block, {"forward": Counter(), "backward": Counter()})
                    if block
                    else outside
                )
                counts = module.collectives()
                if shares_parent_copy(policy, mod_name, module, copied):
                    counts = {**counts, "backward": counts["backward"][1:]}
                for phase, kinds in counts.items():
                    target[phase].update(kinds)
        for name in policy.tensor_parallel().grad_sum:  # replicated, gradient summed
            block = inside(name)
            target = (
                counts_by_block.setdefault(block, {"forward": Counter(), "backward": Counter()}) if block else outside
            )
            target["backward"]["all_reduce"] += 1
        for name, desc in entries:
            block = inside(name)
            target = (
                counts_by_block.setdefault(block, {"forward": Counter(), "backward": Counter()}) if block else outside
            )
            target["backward"]["all_reduce"] += len(desc.enter_tp_region)
        for block, counts in counts_by_block.items():
            per_block.setdefault(block_cls[block], counts)
        if config.check_inputs == "always":  # by default only the first forward and shape changes check
            outside["forward"]["all_gather"] += 1  # the input check (ShardConfig.check_inputs)
    step = {"forward": Counter(outside["forward"]), "backward": Counter(outside["backward"])}
    for counts in counts_by_block.values():
        for phase in step:
            step[phase].update(counts[phase])

    return per_block, outside, step
