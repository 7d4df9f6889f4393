"""What ``shardcore explain --seq`` adds to the collective counts: the bytes a rank puts into them per step."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..tensor_parallel.linear import Linear1D_Col
from ..tensor_parallel.parallel_module import ParallelModule
from .counts import shares_parent_copy


def _region_width(module) -> int | None:
    """The input features of the first column-parallel layer under ``module``: the width of the
    activation whose gradient an ``enter_tp_region`` entry all-reduces."""
    return next((m.in_features for m in module.modules() if isinstance(m, Linear1D_Col)), None)


def collective_bytes_per_step(build, tokens: int, itemsize: int) -> tuple[dict[str, Any] | None, str | None]:
    """``({"forward": {kind: bytes}, "backward": {...}}, None)``: the bytes this rank puts into the
    collectives of one training step on ``tokens`` tokens (steady state: the input check excluded),
    or ``(None, why)`` when they are not known ahead (a layout or layer this does not model)."""
    config, layout = build.config, build.layout
    if layout.pp > 1 or build.sequence_mode is not None or layout.ep > 1:
        return None, "the bytes are modelled for tensor parallelism alone (no pp, sp, sequence split or ep)"
    if config.check_inputs == "always":
        return None, "check_inputs='always' all-gathers each input's signature every step (not modelled)"
    model, policy = build.model, build.policy
    step = {"forward": Counter(), "backward": Counter()}
    if not build.tensor_parallel:
        return {phase: {} for phase in step}, None
    copied: set[str] = set()
    for name, module in model.named_modules():
        if not isinstance(module, ParallelModule):
            continue
        sizes = module.collective_bytes(tokens, itemsize)
        if sizes is None:
            return None, f"{type(module).__name__} ({name}) does not say its bytes ahead"
        kinds = module.collectives()
        if shares_parent_copy(policy, name, module, copied):  # the parent's one copy: counted once
            kinds, sizes = {**kinds, "backward": kinds["backward"][1:]}, {**sizes, "backward": sizes["backward"][1:]}
        for phase in step:
            for kind, n in zip(kinds[phase], sizes[phase], strict=True):
                step[phase][kind] += n
    params = dict(model.named_parameters())
    for name in policy.tensor_parallel().grad_sum:
        step["backward"]["all_reduce"] += params[name].numel() * params[name].element_size()
    for name, _, desc in build.plan or []:
        block = model.get_submodule(name)
        for suffix in desc.enter_tp_region:
            width = _region_width(block.get_submodule(suffix))
            if width is None:
                return None, f"{name}.{suffix}: a tensor-parallel region without a column layer"
            step["backward"]["all_reduce"] += tokens * width * itemsize
    return {phase: dict(+c) for phase, c in step.items()}, None
