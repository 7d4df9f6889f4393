"""``shardcore explain``: how a model would be cut, before launching a single process.

:func:`explain` builds the model on the meta device (no weights allocated), runs its policy's
checks and replacements exactly as :func:`shardcore.optimize` would, but over a
:class:`~shardcore.distributed.collectives.PaperGroup` (this process plays rank 0 of the group; no process
group, no torchrun, no collective), and reports per module pattern the parallel replacement,
the bytes rank 0 holds, the collectives per layer in forward and backward, the attention
backend, and the pipeline stages' bytes for ``pp > 1``. A layout the policy refuses raises the
same error ``optimize`` raises, with the tensor-parallel sizes the model accepts.
"""

from __future__ import annotations

import importlib
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import nn

from .config import ShardConfig
from .distributed import ParallelLayout
from .distributed.collectives import PaperGroup
from .tensor_parallel.linear import Linear1D_Col
from .tensor_parallel.parallel_module import ParallelModule

__all__ = ["ExplainError", "explain", "format_report", "load_for_explain"]

_LAYER_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


class ExplainError(ValueError):
    """The layout cannot be used with the model; the message is what ``optimize`` would raise."""

    def __init__(self, message: str, valid_tp: list[int]) -> None:
        super().__init__(message)
        self.valid_tp = valid_tp


def load_for_explain(spec: str | Path, dtype: torch.dtype | None = None) -> nn.Module:
    """Build the model ``spec`` names on the meta device: a directory with a HuggingFace
    ``config.json`` (class from its ``architectures``), or ``module:Class`` / ``module:function``
    (a HuggingFace class is built from its default config, anything else called without arguments)."""
    from .meta import init_empty

    path = Path(spec)
    if path.is_dir() or (path.suffix == ".json" and path.is_file()):
        directory = path if path.is_dir() else path.parent
        import transformers

        from .inference import config_dtype, read_config

        config, arch = read_config(directory, who="explain")
        cls = getattr(transformers, arch, None)
        if cls is None:
            raise ValueError(
                f"explain: config.json names the architecture {arch!r}, which transformers "
                f"{transformers.__version__} does not have"
            )
        dtype = dtype or config_dtype(config)
        with init_empty():
            model = cls._from_config(config)
    else:
        module_name, sep, attr = str(spec).partition(":")
        if not sep or not attr:
            raise ValueError(
                f"explain: {str(spec)!r} is neither a directory with a config.json nor 'module:Class' "
                "(e.g. transformers:LlamaForCausalLM)"
            )
        try:
            target = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"explain: cannot import {spec!r}: {err}") from err
        config_class = getattr(target, "config_class", None)
        with init_empty():
            model = target._from_config(config_class()) if config_class is not None else target()
    if dtype is not None:
        from .checkpoint.materialize import replace_tensors

        replace_tensors(
            model,
            {
                id(p): nn.Parameter(p.to(dtype), requires_grad=p.requires_grad)
                for p in model.parameters()
                if p.is_floating_point() and p.dtype != dtype
            },
        )
    return model


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


def explain(
    model: nn.Module | str | Path,
    tp: int,
    *,
    pp: int = 1,
    sp: int = 1,
    config: ShardConfig | None = None,
    policy=None,
    dtype: torch.dtype | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """The sharding plan of ``model`` at ``tp`` (x ``pp`` x ``sp``) as a JSON-able dict.

    ``model`` is a module built on the meta device (``shardcore.init_empty()``; it is sharded in
    place) or a spec for :func:`load_for_explain`. Raises :class:`ExplainError` with ``optimize``'s
    message when the layout is impossible.
    """
    from . import kernels
    from .sharder import ModelSharder, check_policy_features, resolve_policy

    if not isinstance(model, nn.Module):
        model = load_for_explain(model, dtype)
    elif any(not p.is_meta for p in model.parameters()):
        raise ValueError("explain: pass a model built on the meta device (shardcore.init_empty()) or a spec")
    config = config or ShardConfig()
    config = attrs.evolve(
        config, tensor_parallel_size=tp, pipeline_parallel_size=pp, sequence_parallel_size=sp, data_parallel_size=1
    )
    notes = []
    ParallelLayout.from_config(config, world_size=tp * pp * sp)
    if pp > 1:
        notes.append(
            f"pipeline_parallel_size={pp}: one stage per rank, Policy.blocks() split evenly as optimize cuts them "
            "by default (earlier stages take one more); pipeline_layers= chooses another split"
        )
    if sp > 1:
        notes.append(
            f"sequence_parallel_size={sp}: Ulysses (sequence_parallelism_mode='all_to_all'): heads checked over "
            "tp x sp; its all-to-alls around attention (4 per block forward, 4 backward) are not in the counts below"
        )
    if config.enable_sequence_parallelism and config.sequence_parallelism_mode == "split_gather":
        notes.append(
            "sequence_parallelism_mode='split_gather': the counts below are tensor parallelism's; with the "
            "sequence split, each region's entry all-gathers the sequence (forward) and reduce-scatters its "
            "gradient (backward), each row-parallel exit reduce-scatters (forward) and all-gathers its gradient "
            "(backward), the saved region inputs are all-gathered again in the backward, the gradients of "
            "replicated parameters used on split tokens (norm weights, row-parallel biases) are all-reduced, and "
            "one all-gather joins the sequence after the last block"
            + ("; with enable_sequence_overlap, 2 reduce-scatters per exit" if config.enable_sequence_overlap else "")
        )
    if config.plan is not None and policy is None:
        from .plan import PlanPolicy

        policy = PlanPolicy(config.plan)
    policy = resolve_policy(model, policy)
    valid = _valid_tp_sizes(policy, config)
    checked_tp = tp * sp  # Ulysses splits the heads over sp x tp
    policy.set_shard_config(attrs.evolve(config, tensor_parallel_size=checked_tp), checked_tp)
    try:
        check_policy_features(model, policy, config)
        policy.config_sanity_check()
    except (ValueError, NotImplementedError) as err:
        hint = f" (tensor_parallel_size values this model accepts, up to 64: {valid})" if valid else ""
        raise ExplainError(f"{err}{hint}", valid) from err
    policy.set_shard_config(config, tp)

    full_bytes = _nbytes(model.parameters())
    itemsize = next((p.element_size() for p in model.parameters() if p.is_floating_point()), 4)
    block_names = [n for n, _ in policy.blocks()]
    block_cls = {n: type(m).__name__ for n, m in policy.blocks()}
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)

    sharded_by_tp = tp > 1 and config.enable_tensor_parallelism
    entries: list[tuple[str, Any]] = []
    if sharded_by_tp:
        model = policy.preprocess()
        sharder = ModelSharder(model, policy, PaperGroup(0, tp))
        plan = sharder.plan()
        entries = [(name, desc) for name, _, desc in plan]
        model = sharder.shard(plan)
        model = policy.postprocess()

    # per module pattern: replacement and rank-0 bytes
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
    rank_bytes = _nbytes(model.parameters())

    # collectives: per block class, outside the blocks, per training step
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
                if policy.share_tp_copies and isinstance(module, Linear1D_Col) and module.copy_input:
                    # column layers of one module read one input: one shared copy, one all-reduce
                    parent = mod_name.rpartition(".")[0]
                    if parent in copied:
                        counts = {**counts, "backward": counts["backward"][1:]}
                    copied.add(parent)
                for phase, kinds in counts.items():
                    target[phase].update(kinds)
        for name in getattr(policy, "grad_sum_parameters", ()):  # replicated, gradient summed
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
        if config.check_inputs:
            outside["forward"]["all_gather"] += 1  # the input check (ShardConfig.check_inputs)
    step = {"forward": Counter(outside["forward"]), "backward": Counter(outside["backward"])}
    for counts in counts_by_block.values():
        for phase in step:
            step[phase].update(counts[phase])

    stages = _stage_bytes(model, block_names, pp) if pp > 1 else None

    return {
        "model": type(model).__name__,
        "policy": type(policy).__name__,
        "layout": {"tp": tp, "pp": pp, "sp": sp},
        "dtype_bytes": itemsize,
        "bytes_unsharded": full_bytes,
        "bytes_per_rank": rank_bytes,
        "fraction_per_rank": rank_bytes / full_bytes if full_bytes else 1.0,
        "pipeline_stage_bytes": stages,
        "largest_rank_bytes": max(stages) if stages else rank_bytes,
        "modules": list(rows.values()),
        "blocks": len(block_names),
        "collectives_per_layer": {
            cls: {phase: dict(c) for phase, c in counts.items()} for cls, counts in per_block.items()
        },
        "collectives_outside_layers": {phase: dict(c) for phase, c in outside.items()},
        "collectives_per_step": {phase: dict(c) for phase, c in step.items()},
        "attention": {
            "model": attention,
            "enable_flash_attention": kernels.attention_backend(torch.device(device), _dtype_of(model)),
        },
        "valid_tensor_parallel_sizes": valid,
        "notes": notes,
    }


def _dtype_of(model: nn.Module) -> torch.dtype:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _fmt_counts(counts: dict[str, int] | list[str]) -> str:
    if isinstance(counts, list):
        counts = Counter(counts)
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "-"


def format_report(report: dict[str, Any]) -> str:
    """The report as the table ``shardcore explain`` prints."""
    lay = report["layout"]
    lines = [
        f"{report['model']} ({report['policy']}), tp={lay['tp']} pp={lay['pp']} sp={lay['sp']}",
        f"parameters: {_fmt_bytes(report['bytes_unsharded'])} unsharded, {_fmt_bytes(report['bytes_per_rank'])} "
        f"per tensor-parallel rank ({report['fraction_per_rank']:.4f} of the model)",
    ]
    if report["pipeline_stage_bytes"]:
        per = ", ".join(_fmt_bytes(b) for b in report["pipeline_stage_bytes"])
        lines.append(f"pipeline stages (per rank): {per}; largest rank {_fmt_bytes(report['largest_rank_bytes'])}")
    lines.append("")
    header = ("module pattern", "n", "replacement", "bytes/rank", "fwd", "bwd")
    table = [
        (
            r["pattern"] or "<root>",
            str(r["count"]),
            r["module"] + ("" if r["parallel"] else " (replicated)"),
            _fmt_bytes(r["bytes_per_rank"]),
            _fmt_counts(r["collectives"]["forward"]),
            _fmt_counts(r["collectives"]["backward"]),
        )
        for r in report["modules"]
    ]
    widths = [max(len(x[i]) for x in [header, *table]) for i in range(len(header))]
    for line in [header, *table]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    lines.append("")
    for cls, counts in report["collectives_per_layer"].items():
        lines.append(
            f"collectives per {cls}: forward {_fmt_counts(counts['forward'])}; backward {_fmt_counts(counts['backward'])}"
        )
    out = report["collectives_outside_layers"]
    lines.append(
        f"collectives outside the layers: forward {_fmt_counts(out['forward'])}; backward {_fmt_counts(out['backward'])}"
    )
    step = report["collectives_per_step"]
    lines.append(
        f"collectives per training step: forward {_fmt_counts(step['forward'])}; backward {_fmt_counts(step['backward'])}"
    )
    att = report["attention"]
    lines.append(
        f"attention: {att['model'] or 'the model library default'} as built; with enable_flash_attention: "
        f"{att['enable_flash_attention']}"
    )
    lines.append(f"valid tensor_parallel_size (up to 64): {report['valid_tensor_parallel_sizes']}")
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2)
