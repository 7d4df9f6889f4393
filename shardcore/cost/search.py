"""``shardcore explain MODEL --world N --auto``: every layout the policy accepts for ``N`` ranks,
each predicted by the cost model (:mod:`shardcore.cost.model`), those over the memory cap dropped,
the rest ranked by predicted step time, each with why it lost to the first.

A layout is ``dp x pp x sp x tp = N`` (``ep`` dividing ``dp`` for a model with experts), a
sequence mode for ``sp > 1`` (``all_to_all``, ``ring_attn``), DDP or FSDP for ``dp > 1``, 1F1B
with one sequence per microbatch for ``pp > 1``. Each is checked by optimize's own checks on a
model built on the meta device (``explain``'s paper build): what ``optimize`` would refuse is
listed as refused, with its message. Nothing is allocated, no process is started.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import attrs
import torch
from torch import nn

from ..config import ShardConfig
from ..explain import ExplainError, check_on_paper, explain_on_paper, shard_on_paper
from ..explain.experts import expert_traffic
from ..explain.sequence import sequence_bytes
from ..explain.traffic import collective_bytes_per_step
from .copies import collector_paused, module_copy
from .elementwise import trace
from .facts import attention_width, hidden_size, parameter_walk, stage_facts
from .model import predict
from .sides import planned_roles

SEQUENCE_MODES = ("all_to_all", "ring_attn")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(world: int, *, batch: int, seq: int, blocks: int, experts: int = 0) -> list[dict]:
    """Every ``dp x pp x sp x tp (x ep)`` of ``world`` the workload can be cut into."""
    out = []
    for tp in _divisors(world):
        for pp in _divisors(world // tp):
            for sp in _divisors(world // tp // pp):
                dp = world // tp // pp // sp
                if batch % dp or seq % sp or pp > blocks or (pp > 1 and batch // dp < 1):
                    continue
                modes = SEQUENCE_MODES if sp > 1 else (None,)
                kinds = ("ddp", "fsdp") if dp > 1 else (None,)
                eps = [e for e in _divisors(dp) if experts and experts % e == 0] or [1]
                for mode in modes:
                    for kind in kinds:
                        for ep in eps:
                            micro = batch // dp if pp > 1 else 1
                            out.append(
                                dict(
                                    dp=dp, pp=pp, sp=sp, tp=tp, ep=ep, mode=mode, data_parallel=kind, microbatches=micro
                                )
                            )
    return out


def name(layout: dict) -> str:
    """``dp2 x tp2 (fsdp)``-style label of a layout."""
    dims = [f"{d}{layout[d]}" for d in ("dp", "pp", "sp", "tp") if layout[d] > 1] or ["1 rank"]
    extra = [x for x in (layout["mode"], layout["data_parallel"]) if x]
    extra += [f"ep{layout['ep']}"] if layout["ep"] > 1 else []
    extra += [f"M={layout['microbatches']}"] if layout["pp"] > 1 else []
    return " x ".join(dims) + (f" ({', '.join(extra)})" if extra else "")


def shard_config(layout: dict, base: ShardConfig | None = None) -> ShardConfig:
    """The :class:`~shardcore.ShardConfig` that runs ``layout``."""
    return attrs.evolve(base or ShardConfig(), **_layout_fields(layout))


def _config_fields(layout: dict) -> dict[str, Any]:
    """The ``ShardConfig`` fields ``layout`` sets, those at their default left out (to print)."""
    defaults = ShardConfig()
    fields = _layout_fields(layout)
    return {k: v for k, v in fields.items() if v != getattr(defaults, k) or k == "tensor_parallel_size"}


def _layout_fields(layout: dict) -> dict[str, Any]:
    fields: dict[str, Any] = dict(
        tensor_parallel_size=layout["tp"],
        pipeline_parallel_size=layout["pp"],
        sequence_parallel_size=layout["sp"],
        data_parallel_size=layout["dp"],
        expert_parallel_size=layout["ep"],
        data_parallel=layout["data_parallel"],
        data_parallel_shard_size=None,  # a base config's HSDP shard size left out where the layout is not HSDP
    )
    if layout["data_parallel"] == "hsdp":
        fields.update(data_parallel_shard_size=layout.get("shard", layout["dp"]))
    if layout["sp"] > 1:
        fields.update(enable_sequence_parallelism=True, sequence_parallelism_mode=layout["mode"])
    if layout["pp"] > 1:
        fields.update(num_microbatches=layout["microbatches"], pipeline_schedule="1F1B")
    return fields


def _tp_traffic(report: dict, build, tokens: int, itemsize: int) -> dict | None:
    """Per kind: ``(collectives per step, bytes per token, fixed bytes)`` of a tensor-parallel build."""
    low, _ = collective_bytes_per_step(build, tokens, itemsize)
    high, _ = collective_bytes_per_step(build, 2 * tokens, itemsize)
    if low is None or high is None:
        return None
    counts: Counter = Counter()
    for phase in ("forward", "backward"):
        counts.update(report["collectives_per_step"][phase])
    out = {}
    for kind, count in counts.items():
        lo = sum(low[p].get(kind, 0) for p in low)
        hi = sum(high[p].get(kind, 0) for p in high)
        out[kind] = (count, (hi - lo) / tokens, lo - (hi - lo))
    return out


def sp_traffic(seq: dict | None, layout: dict) -> dict | None:
    """Per layer ``[(kind, count, bytes each rank contributes)]`` of the sequence mode (``seq``:
    :func:`~shardcore.explain.sequence.sequence_bytes`)."""
    if not seq:
        return None
    sp, mode, sent = layout["sp"], layout["mode"], seq["bytes_sent_per_layer"]
    if mode == "ring_attn":
        return {"per_layer": [("send_recv", sp - 1, sent["forward"]), ("send_recv", sp, sent["backward"])]}
    if mode == "all_gather_kv":
        return {"per_layer": [("all_gather", 2, sent["forward"] / (sp - 1)), ("reduce_scatter", 2, sent["backward"])]}
    return {"per_layer": [("all_to_all", 4, sent[p] * sp / (sp - 1)) for p in ("forward", "backward")]}


def workload_facts(
    model: nn.Module,
    layout: dict,
    *,
    seq: int,
    batch: int,
    base: ShardConfig | None = None,
    tp_cache: dict | None = None,
    built: dict | None = None,
    traced: dict | None = None,
) -> dict:
    """The cost model's input for ``layout``: optimize's checks on a paper build of a copy of the
    meta ``model`` (raising :class:`~shardcore.explain.ExplainError` or ``NotImplementedError`` as
    ``optimize`` would). ``tp_cache``: tensor-parallel traffic already computed, by degree;
    ``built``: paper builds already made, by ``(tp, sp, sequence mode, ep)``: the sharding does not
    depend on ``pp``, ``dp`` or the data-parallel engine (what does, the stages and the traffic per
    data-parallel rank's tokens, is read from the build for each layout); ``traced``: the model's elementwise work
    (:func:`~shardcore.cost.elementwise.trace`; without it a step is priced by its FLOPs alone)."""
    config = shard_config(layout, base)
    dp, sp, tp = layout["dp"], layout["sp"], layout["tp"]
    kw = dict(pp=layout["pp"], sp=sp, ep=layout["ep"], dp=dp, config=config)
    check_on_paper(model, tp, **kw)  # refused layouts cost no copy of the model
    key = (tp, sp, layout["mode"], layout["ep"])
    paper = built.get(key) if built is not None else None
    if paper is None:  # a refusal raises here, with this layout's own message, and is not kept
        itemsize = next((p.element_size() for p in model.parameters() if p.is_floating_point()), 4)
        build, blocks = shard_on_paper(module_copy(model), tp, **kw)
        roles = planned_roles(build.model, build.policy) if tp == 1 else None  # nothing replaced: the plan's roles
        paper = (itemsize, build, blocks, parameter_walk(build.model, blocks, roles))
        if built is not None:
            built[key] = paper
    return _facts(model, paper, layout, seq, batch, base, tp_cache) | {"elementwise": traced}


def _facts(model: nn.Module, paper: tuple, layout: dict, seq: int, batch: int, base, tp_cache: dict | None) -> dict:
    """:func:`workload_facts` of ``layout`` from its paper build ``(itemsize, build, blocks, parameter walk)``."""
    itemsize, build, blocks, walk = paper
    dp, sp, tp = layout["dp"], layout["sp"], layout["tp"]
    sharded = build.model
    dtype = next((p.dtype for p in sharded.parameters() if p.is_floating_point()), torch.float32)
    facts = {
        "seq": seq,
        "batch": batch,
        "itemsize": itemsize,
        "dtype": str(dtype).removeprefix("torch."),
        "stages": stage_facts(sharded, blocks, layout["pp"], layout["ep"], walk),
        "attention": attention_width(sharded, build.policy, tp),
        "hidden": hidden_size(sharded),
        "sp": sp_traffic(sequence_bytes(build, seq, batch // dp, itemsize), layout) if sp > 1 else None,
        "logits_gathered": tp if tp > 1 and not (base or ShardConfig()).parallel_output else 1,  # the head's ranks
    }
    if layout["ep"] > 1:
        sent = expert_traffic(sharded, seq * (batch // dp), itemsize).get("all_to_all_bytes_per_layer")
        if sent:
            facts["ep"] = (5, sent["forward"] + sent["backward"])
    tp_cache = {} if tp_cache is None else tp_cache
    if tp > 1 and tp not in tp_cache:
        tp_only = {**layout, "pp": 1, "sp": 1, "ep": 1, "dp": 1, "data_parallel": None}
        report1, build1, _ = explain_on_paper(module_copy(model), tp, config=shard_config(tp_only, base))
        tp_cache[tp] = _tp_traffic(report1, build1, 1, itemsize)
    facts["tp"] = tp_cache.get(tp)
    return facts


def search(
    model: nn.Module,
    world: int,
    profile: dict,
    *,
    seq: int,
    batch: int,
    memory: float | None = None,
    optimizer: str = "adamw",
    base: ShardConfig | None = None,
) -> dict[str, Any]:
    """Every layout for ``world`` ranks predicted and ranked (see the module docstring).
    ``model``: built on the meta device (left as it is: each layout shards a copy); ``memory``:
    bytes a rank may hold (default: the profile's ``memory_bytes_per_rank``)."""
    if any(not p.is_meta for p in model.parameters()):
        raise ValueError("explain --auto: pass a model built on the meta device (shardcore.init_empty())")
    if world < 1 or seq < 1 or batch < 1:
        raise ValueError(f"explain --auto: world ({world}), seq ({seq}) and batch ({batch}) must be at least 1")
    start = time.perf_counter()
    cap = memory if memory is not None else profile.get("memory_bytes_per_rank") or float("inf")
    experts = _expert_count(model)
    blocks = len(_blocks_of(module_copy(model), base))
    ranked, refused, tp_cache, built = [], [], {}, {}
    traced = trace(model, seq, hidden_size(model))  # once: the unsharded model's elementwise work
    with collector_paused():
        for layout in candidates(world, batch=batch, seq=seq, blocks=blocks, experts=experts):
            try:
                facts = workload_facts(
                    model, layout, seq=seq, batch=batch, base=base, tp_cache=tp_cache, built=built, traced=traced
                )
            except (ExplainError, NotImplementedError, ValueError) as err:
                why = str(err).splitlines()[0].split(" (tensor_parallel_size values this model accepts")[0]
                refused.append({"layout": layout, "name": name(layout), "refused": why})
                continue
            row = {"layout": layout, "name": name(layout), **predict(facts, layout, profile, optimizer=optimizer)}
            row["config"] = _config_fields(layout)
            row["fits"] = row["memory_bytes"]["total"] <= cap
            ranked.append(row)
        del built  # the paper builds, before the collector runs again
    ranked.sort(key=lambda r: (not r["fits"], r["step_s"]))
    best = ranked[0] if ranked and ranked[0]["fits"] else None
    for row in ranked:
        row["why"] = why_lost(row, best, cap)
    return {
        "model": type(model).__name__,
        "world": world,
        "seq": seq,
        "batch": batch,
        "optimizer": optimizer,
        "memory_cap_bytes": cap,
        "profile": profile.get("path", "given"),
        "best": best,
        "ranked": ranked,
        "refused": refused,
        "candidates": len(ranked) + len(refused),
        "elementwise": traced,  # None: the model did not run on the meta device, its steps priced by FLOPs alone
        "elementwise_priced": traced is not None
        and all("elementwise_bytes_per_s" in e for e in profile["per_rank"].values()),
        "seconds": time.perf_counter() - start,
    }


def why_lost(row: dict, best: dict | None, cap: float) -> str:
    """The terms by which ``row`` is slower than ``best`` (or the memory it lacks)."""
    if not row["fits"]:
        return f"needs {row['memory_bytes']['total'] / 2**30:.2f} GiB per rank, over the cap of {cap / 2**30:.2f} GiB"
    if best is None or row is best:
        return "fastest predicted"
    terms = {"compute": row["compute_s"] - best["compute_s"], "pipeline bubble": row["bubble_s"] - best["bubble_s"]}
    for dim, seconds in row["communication_s"].items():
        terms[f"{dim} communication"] = seconds - best["communication_s"][dim]
    terms["optimizer step"] = row["optimizer_s"] - best["optimizer_s"]
    worst = sorted((t for t in terms.items() if t[1] > 0), key=lambda t: -t[1])[:2]
    slower = row["step_s"] / best["step_s"]
    if not worst:
        return f"{slower:.2f}x the best (the same terms)"
    return f"{slower:.2f}x the best: " + ", ".join(f"+{s * 1e3:.1f} ms {what}" for what, s in worst)


def _expert_count(model: nn.Module) -> int:
    """The experts of a mixture-of-experts model, from its config (0: none)."""
    cfg = getattr(model, "config", None)
    if not getattr(cfg, "num_experts_per_tok", None):
        return 0
    return getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None) or 0


def _blocks_of(model: nn.Module, base: ShardConfig | None) -> list[str]:
    _, _, blocks = explain_on_paper(model, 1, config=base)
    return blocks
