"""Check ``shardcore explain`` against a real sharded step: what it predicts is what runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..config import ShardConfig
from .compare import _loss

__all__ = ["assert_explain_matches"]


def assert_explain_matches(
    build_fn: Callable[[], nn.Module],
    inputs: dict[str, Any],
    config: ShardConfig,
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    seed: int = 0,
    price_bytes: bool = True,
) -> dict[str, Any]:
    """On every rank of a live group: :func:`shardcore.explain.explain` of ``build_fn()`` built on
    the meta device must predict the collectives a steady-state forward + backward issues (counted,
    by kind: the second step, as the first also checks the inputs unless ``check_inputs="always"``,
    which explain then counts) and rank 0's parameter bytes. Returns the report.

    explain prices each block's collectives at the input ids' length; ``price_bytes=False`` leaves
    out the bytes per step (still checking the collectives by kind and the held bytes) for a model
    whose blocks run on other lengths than its ids (a vision tower's patches beside a language
    model's tokens)."""
    import shardcore
    from shardcore.distributed.collectives import count_collective_bytes, count_collectives, group_rank
    from shardcore.explain import explain

    with shardcore.init_empty():
        meta = build_fn()
    ids = inputs.get("input_ids")
    priced = price_bytes and isinstance(ids, torch.Tensor)
    shape = {"seq": ids.shape[-1], "batch": ids.numel() // ids.shape[-1]} if priced else {}
    report = explain(
        meta,
        config.tensor_parallel_size,
        pp=config.pipeline_parallel_size,
        sp=config.sequence_parallel_size,
        ep=config.expert_parallel_size,
        config=config,
        **shape,
    )

    torch.manual_seed(seed)
    model = shardcore.optimize(build_fn(), config)
    _loss(model(**inputs), loss_fn).backward()  # the first step: the input check's forward
    model.zero_grad(set_to_none=True)
    with count_collectives() as fwd, count_collective_bytes() as fwd_bytes:
        out = model(**inputs)
    with count_collectives() as bwd, count_collective_bytes() as bwd_bytes:
        _loss(out, loss_fn).backward()
    measured = {"forward": dict(fwd), "backward": dict(bwd)}
    traffic = report.get("collective_bytes_per_step")
    if traffic is not None:  # predicted (tensor parallelism, token inputs): must be what the step sent
        sent = {"forward": dict(fwd_bytes), "backward": dict(bwd_bytes)}
        assert traffic == sent, f"explain predicts {traffic} bytes per step, this rank put {sent} into its collectives"
    assert report["collectives_per_step"] == measured, (
        f"explain predicts {report['collectives_per_step']}, a step issued {measured}"
    )
    if group_rank(model.shardcore.process_group) == 0:
        held = sum(p.numel() * p.element_size() for p in model.parameters())
        assert report["bytes_per_rank"] == held, (
            f"explain says rank 0 holds {report['bytes_per_rank']} B, it holds {held} B"
        )
    return report
