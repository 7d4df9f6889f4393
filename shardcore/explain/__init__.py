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

from pathlib import Path
from typing import Any

import attrs
import torch
from torch import nn

from ..config import ShardConfig
from ..distributed import ParallelLayout
from ..distributed.collectives import PaperGroup
from ..pipeline.check import pipeline_blocks
from .counts import _collective_counts, _module_rows, _nbytes, _stage_bytes, _valid_tp_sizes
from .experts import add_balance_counts, expert_traffic
from .report import format_report, to_json
from .sequence import add_sequence_counts, sequence_bytes
from .traffic import collective_bytes_per_step

__all__ = [
    "ExplainError",
    "check_on_paper",
    "explain",
    "explain_on_paper",
    "format_report",
    "load_for_explain",
    "shard_on_paper",
    "to_json",
]


class ExplainError(ValueError):
    """The layout cannot be used with the model; the message is what ``optimize`` would raise."""

    def __init__(self, message: str, valid_tp: list[int]) -> None:
        super().__init__(message)
        self.valid_tp = valid_tp


def load_for_explain(spec: str | Path, dtype: torch.dtype | None = None) -> nn.Module:
    """Build the model ``spec`` names on the meta device (:func:`~.source.model_source`: a directory
    with a HuggingFace ``config.json``, or ``module:Class`` / ``module:function``); a directory's
    config gives the dtype unless ``dtype`` does."""
    from ..inference import config_dtype
    from ..meta import init_empty
    from .source import from_directory, model_source

    config, target = model_source(spec, "explain")
    if from_directory(spec):
        dtype = dtype or config_dtype(config)
    with init_empty():
        model = target._from_config(config) if config is not None else target()
    if dtype is not None:
        from ..checkpoint.materialize import replace_tensors

        replace_tensors(
            model,
            {
                id(p): nn.Parameter(p.to(dtype), requires_grad=p.requires_grad)
                for p in model.parameters()
                if p.is_floating_point() and p.dtype != dtype
            },
        )
    return model


def _paper_config(config: ShardConfig, tp: int, pp: int, sp: int, ep: int = 1, dp: int = 1) -> ShardConfig:
    """``config`` at the layout explained; ``sp > 1`` without a mode is Ulysses (``all_to_all``);
    ``ep > 1``: ``dp`` data-parallel ranks (DDP unless ``config`` says FSDP), the experts over ``ep`` of them."""
    config = attrs.evolve(
        config, tensor_parallel_size=tp, pipeline_parallel_size=pp, sequence_parallel_size=sp, data_parallel_size=dp
    )
    if ep > 1:
        config = attrs.evolve(config, expert_parallel_size=ep, data_parallel=config.data_parallel or "ddp")
    if sp > 1 and not config.enable_sequence_parallelism:
        config = attrs.evolve(config, enable_sequence_parallelism=True, sequence_parallelism_mode="all_to_all")
    return config


def _notes(config: ShardConfig, pp: int, sp: int) -> list[str]:
    notes = []
    if pp > 1:
        notes.append(
            f"pipeline_parallel_size={pp}: one stage per rank, Policy.blocks() split evenly as optimize cuts them "
            "by default (earlier stages take one more); pipeline_layers= chooses another split"
        )
    mode = config.sequence_parallelism_mode
    if sp > 1:
        what = {
            "all_to_all": "Ulysses: heads checked over tp x sp; 4 all-to-alls per attention forward, 4 backward",
            "ring_attn": f"context parallelism: {sp - 1} ring shifts of the keys and values per attention forward, "
            f"{sp} of them with their gradients backward",
            "all_gather_kv": "keys and values all-gathered per attention (2 all-gathers forward, 2 reduce-scatters "
            "backward)",
        }[mode]
        notes.append(
            f"sequence_parallel_size={sp}, sequence_parallelism_mode={mode!r}: {what}; each block parameter's "
            "gradient all-reduced over sp; the sequence all-gathered after the last block (and its gradient at the "
            "first); counted below with one attention per block"
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
    return notes


def explain(
    model: nn.Module | str | Path,
    tp: int,
    *,
    pp: int = 1,
    sp: int = 1,
    ep: int = 1,
    config: ShardConfig | None = None,
    policy=None,
    dtype: torch.dtype | None = None,
    device: str = "cpu",
    seq: int | None = None,
    batch: int = 1,
    dp: int | None = None,
) -> dict[str, Any]:
    """The sharding plan of ``model`` at ``tp`` (x ``pp`` x ``sp``) as a JSON-able dict.

    ``model`` is a module built on the meta device (``shardcore.init_empty()``; it is sharded in
    place) or a spec for :func:`load_for_explain`. Raises :class:`ExplainError` with ``optimize``'s
    message when the layout is impossible. ``sp > 1``: ``config``'s mode (else ``all_to_all``);
    ``seq`` (``batch``): the keys and values a rank holds and sends (``"sequence"``), the bytes it puts
    into each kind of collective per step (``"collective_bytes_per_step"``). ``ep > 1``: experts over
    ``ep`` data-parallel ranks (``"experts"``: bytes per rank, all-to-all bytes per layer). ``dp``:
    the data-parallel degree beside them (default ``ep``; ``config.data_parallel`` says DDP or FSDP).
    """
    return explain_on_paper(
        model, tp, pp=pp, sp=sp, ep=ep, config=config, policy=policy, dtype=dtype, device=device, seq=seq,
        batch=batch, dp=dp,
    )[0]  # fmt: skip


def explain_on_paper(
    model: nn.Module | str | Path,
    tp: int,
    *,
    pp: int = 1,
    sp: int = 1,
    ep: int = 1,
    config: ShardConfig | None = None,
    policy=None,
    dtype: torch.dtype | None = None,
    device: str = "cpu",
    seq: int | None = None,
    batch: int = 1,
    dp: int | None = None,
) -> tuple[dict[str, Any], Any, list[str]]:
    """:func:`explain`'s report with what it was computed on: optimize's build over the paper group
    (``build.model`` sharded as rank 0 holds it, ``build.policy``) and the blocks' names."""
    model = model if isinstance(model, nn.Module) else load_for_explain(model, dtype)
    if any(not p.is_meta for p in model.parameters()):
        raise ValueError("explain: pass a model built on the meta device (shardcore.init_empty()) or a spec")
    config = _paper_config(config or ShardConfig(), tp, pp, sp, ep, dp or ep)
    full_bytes = _nbytes(model.parameters())
    itemsize = next((p.element_size() for p in model.parameters() if p.is_floating_point()), 4)
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    build, valid, block_names, block_cls = _shard_on_paper(model, config, policy, tp, pp, sp * (dp or ep))
    model, policy = build.model, build.policy
    rank_bytes = _nbytes(model.parameters())
    per_block, outside, step = _collective_counts(build, block_names, block_cls)
    add_sequence_counts(build, build.policy.blocks(), block_cls, per_block, outside, step)
    add_balance_counts(build, outside, step)
    traffic, why = collective_bytes_per_step(build, seq * batch, itemsize) if seq else (None, None)
    staged = [n for n, _ in pipeline_blocks(policy)]  # what the stages are cut from (a composite: its LM's)
    stages = _stage_bytes(model, staged, pp) if pp > 1 else None
    report = {
        "model": type(model).__name__,
        "policy": type(policy).__name__,
        "layout": {"tp": tp, "pp": pp, "sp": sp, "ep": ep},
        "dtype_bytes": itemsize,
        "bytes_unsharded": full_bytes,
        "bytes_per_rank": rank_bytes,
        "fraction_per_rank": rank_bytes / full_bytes if full_bytes else 1.0,
        "pipeline_stage_bytes": stages,
        "largest_rank_bytes": max(stages) if stages else rank_bytes,
        "modules": list(_module_rows(model).values()),
        "blocks": len(block_names),
        "collectives_per_layer": {cls: _plain(counts) for cls, counts in per_block.items()},
        "collectives_outside_layers": _plain(outside),
        "collectives_per_step": _plain(step),
        "collective_bytes_per_step": traffic,
        "attention": {"model": attention, "enable_flash_attention": _backend(model, device)},
        "valid_tensor_parallel_sizes": valid,
        "sequence": sequence_bytes(build, seq, batch, itemsize) if seq else None,
        "experts": expert_traffic(model, seq * batch if seq else None, itemsize) if ep > 1 else None,
        "notes": _notes(config, pp, sp) + ([f"collective bytes per step not predicted: {why}"] if why else []),
    }
    return report, build, staged


def shard_on_paper(
    model: nn.Module, tp: int, *, pp: int = 1, sp: int = 1, ep: int = 1, dp: int | None = None, config=None
):
    """:func:`explain_on_paper`'s build without its report (the layout search's facts need only the
    sharded model): ``(build, the names of the blocks the stages are cut from)``; ``model`` is sharded."""
    config = _paper_config(config or ShardConfig(), tp, pp, sp, ep, dp or ep)
    build = _shard_on_paper(model, config, None, tp, pp, sp * (dp or ep))[0]
    return build, [n for n, _ in pipeline_blocks(build.policy)]


def check_on_paper(
    model: nn.Module, tp: int, *, pp: int = 1, sp: int = 1, ep: int = 1, dp: int | None = None, config=None
) -> None:
    """``optimize``'s checks of the layout on a meta ``model``, which is left as it is: raises
    :class:`ExplainError` with ``optimize``'s message where the layout is refused."""
    from ..steps import Build, run_steps

    config = _paper_config(config or ShardConfig(), tp, pp, sp, ep, dp or ep)
    layout = ParallelLayout.from_config(config, world_size=tp * pp * sp * (dp or ep))
    build = Build(model, config, None, layout=layout, group=PaperGroup(0, tp))
    try:
        run_steps(build, ("policy", "checks"))
    except (ValueError, NotImplementedError) as err:
        raise ExplainError(str(err), []) from err


def _shard_on_paper(model: nn.Module, config: ShardConfig, policy, tp: int, pp: int, ranks_beside: int):
    """``optimize``'s policy, checks and sharding steps over a paper group: the build, the valid
    tensor-parallel sizes, and the blocks' names and classes (``ranks_beside``: sp x dp)."""
    from ..steps import PAPER_STEPS, Build, run_steps

    layout = ParallelLayout.from_config(config, world_size=tp * pp * ranks_beside)  # optimize's layout step, on paper
    build = Build(model, config, policy, layout=layout, group=PaperGroup(0, tp))
    run_steps(build, ("policy",))
    valid = _valid_tp_sizes(build.policy, config)
    build.policy.set_shard_config(config, tp)
    block_names = [n for n, _ in build.policy.blocks()]
    block_cls = {n: type(m).__name__ for n, m in build.policy.blocks()}
    try:  # optimize's own checks, in its order, then its sharding over the paper group
        run_steps(build, tuple(s for s in PAPER_STEPS if s != "policy"))
    except (ValueError, NotImplementedError) as err:
        hint = f" (tensor_parallel_size values this model accepts, up to 64: {valid})" if valid else ""
        raise ExplainError(f"{err}{hint}", valid) from err
    return build, valid, block_names, block_cls


def _plain(counts) -> dict:
    """``{phase: {kind: n}}`` without kinds counted zero."""
    return {phase: dict(+c) for phase, c in counts.items()}


def _backend(model: nn.Module, device: str) -> str:
    from .. import kernels

    return kernels.attention_backend(torch.device(device), _dtype_of(model))


def _dtype_of(model: nn.Module) -> torch.dtype:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
