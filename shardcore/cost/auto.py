"""``ShardConfig(auto=True)``: the layout ``shardcore explain --auto`` would choose, chosen inside
the job.

:func:`optimize` is :func:`shardcore.optimize`: with ``config.auto`` set, rank 0 copies the model
onto the meta device (shapes only, the weights untouched), searches every layout of the world
(:func:`shardcore.cost.search`, this machine's cached profile: never measured inside a job) and
sends the chosen fields, or the error that stopped it, to every rank in one broadcast; each rank
then shards by them through the core ``optimize``. Every rank takes the same layout and raises the
same error. Without ``auto`` it is the core ``optimize``, unchanged.
"""

from __future__ import annotations

import copy
import logging

import attrs
import torch
import torch.distributed as dist
from torch import nn

from ..config import ShardConfig
from ..distributed import init_from_env
from ..distributed.objects import broadcast_object
from ..integrations.hf.peft import peft_base_model
from ..steps import shard

__all__ = ["choose", "meta_copy", "optimize"]

log = logging.getLogger("shardcore.auto")


def meta_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are on the meta device (same shapes,
    dtypes, ties and ``requires_grad``); ``model`` is left as it is."""
    memo: dict[int, torch.Tensor] = {}
    for p in model.parameters():
        memo.setdefault(id(p), nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad))
    for b in model.buffers():
        memo.setdefault(id(b), torch.empty_like(b, device="meta"))
    return copy.deepcopy(model, memo)


def _workload(model: nn.Module, auto, world: int) -> tuple[int, int]:
    cfg = getattr(model, "config", None)
    seq = auto.seq or getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    if not seq:
        raise ValueError(
            f"ShardConfig(auto=True): {type(model).__name__}'s config names no maximum length to plan for; "
            "say the sequence length: auto=shardcore.AutoLayout(seq=..., batch=...)"
        )
    return seq, auto.batch or world


def choose(model: nn.Module, config: ShardConfig, world: int) -> tuple[ShardConfig, dict]:
    """On one rank: the config ``config.auto`` resolves to for ``world`` ranks, and the chosen row
    (name, predicted seconds and bytes, the config fields); raises when no layout fits."""
    from .profile import load_profile  # here: `import shardcore` stays free of the search and explain
    from .search import search, shard_config

    auto = config.auto
    inner = peft_base_model(model) or model
    seq, batch = _workload(inner, auto, world)
    profile = load_profile(auto.profile, measure=False)
    memory = auto.memory_gb * 2**30 if auto.memory_gb is not None else None
    base = attrs.evolve(config, auto=None)
    plan = search(meta_copy(inner), world, profile, seq=seq, batch=batch, memory=memory,
                  optimizer=auto.optimizer, base=base)  # fmt: skip
    best = plan["best"]
    if best is None:
        over = plan["ranked"][0]["why"] if plan["ranked"] else "every layout was refused"
        refused = "; ".join(f"{r['name']}: {r['refused']}" for r in plan["refused"][:3])
        raise ValueError(
            f"ShardConfig(auto=...): no layout of {world} ranks fits {type(inner).__name__} at seq {seq} x "
            f"batch {batch} ({over}{'; ' + refused if refused else ''}); raise AutoLayout(memory_gb=...), "
            "lower seq or batch, or run on more ranks"
        )
    row = {k: best[k] for k in ("name", "step_s", "memory_bytes", "config")}
    row.update(seq=seq, batch=batch, world=world, layouts=len(plan["ranked"]), profile=plan["profile"])
    return shard_config(best["layout"], base), row


def optimize(model: nn.Module, config: ShardConfig | None = None, *, policy=None) -> nn.Module:
    """``shardcore.optimize``, the one public entry: the core's steps (:func:`shardcore.steps.shard`: shard
    ``model`` in place and return it), with ``config.auto`` (``True`` or an :class:`~shardcore.AutoLayout`)
    resolved first: rank 0 chooses the layout for the job's world size by the cost model over
    this machine's cached profile and broadcasts it (or the error that stopped it, then raised on
    every rank alike); the choice is logged once and recorded as ``model.shardcore.auto``.
    ``policy=`` with ``auto``: ``ValueError`` (the search uses the installed plugins' policies).
    """
    if config is None or getattr(config, "auto", None) is None:
        return shard(model, config, policy=policy)
    if policy is not None:
        raise ValueError(
            "ShardConfig(auto=...) chooses with the installed plugins' policies; with policy= set the layout yourself"
        )
    init_from_env(config.collective_timeout)
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    message = None
    if rank == 0:
        try:
            resolved, row = choose(model, config, world)
            message = ("ok", resolved, row)
        except Exception as err:  # sent to every rank, raised there alike
            message = ("error", type(err), str(err))
    message = broadcast_object(message, 0, where="the automatic layout chosen by rank 0")
    if message[0] == "error":
        _, kind, text = message
        try:
            err = kind(text)
        except TypeError:  # an error class built from more than a message
            err = RuntimeError(f"{kind.__name__}: {text}")
        raise err
    _, resolved, row = message
    if rank == 0:
        log.info(
            "ShardConfig(auto): %s for %d ranks at seq %d x batch %d: predicted %.3f s per step, %.2f GiB per rank "
            "(of %d layouts; shardcore explain --auto lists them)",
            row["name"], world, row["seq"], row["batch"], row["step_s"],
            row["memory_bytes"]["total"] / 2**30, row["layouts"],
        )  # fmt: skip
    model = shard(model, resolved)
    info = attrs.evolve(model.shardcore, auto=row)
    model.shardcore = info
    inner = peft_base_model(model)
    if inner is not None:
        inner.shardcore = info
    return model
