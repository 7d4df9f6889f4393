"""What ``shardcore explain --ep`` adds: the experts' bytes per rank and their tokens' all-to-all traffic."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..expert_parallel import expert_modules


def add_balance_counts(build, outside, step) -> None:
    """``global_batch_balance``: each MoE layer's router logits all-gathered over the data-parallel
    ranks in the forward (their gradient reduce-scattered in the backward), in place."""
    if not (build.config.global_batch_balance and build.layout.dp > 1):
        return
    layers = len(expert_modules(build.model))
    for phase, kind in (("forward", "all_gather"), ("backward", "reduce_scatter")):
        outside[phase][kind] += layers
        step[phase][kind] += layers


def expert_traffic(model: nn.Module, tokens: int | None, itemsize: int) -> dict[str, Any]:
    """Per rank: the bytes of its experts, and with ``tokens`` (per data-parallel rank) what one
    layer's dispatch sends (forward: the routed hidden states there and the outputs back; backward:
    their gradients both ways), from the experts module's own estimate under even routing."""
    modules = expert_modules(model)
    held = sum(p.numel() * p.element_size() for m in modules for p in m.parameters())
    out: dict[str, Any] = {"layers": len(modules), "expert_bytes_per_rank": held}
    if tokens and modules and hasattr(modules[0], "traffic"):
        out["all_to_all_bytes_per_layer"] = modules[0].traffic(tokens, itemsize)
    out["note"] = (
        "each token's hidden state goes to the ranks of its chosen experts and back by all-to-all (3 forward: the "
        "counts, the tokens there, the outputs back; 2 backward), bytes estimated with the choices spread evenly "
        "over the experts; the dense weights' gradients all-reduced over the data-parallel ranks by DDP (or "
        "reduce-scattered by FSDP), the experts' over the ranks holding the same experts; with "
        "global_batch_balance, each layer's router logits all-gathered over dp (one more for an attention mask)"
    )
    return out
