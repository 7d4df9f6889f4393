"""One rank's memory through a training step, measured at real shapes without the hardware, beside
``explain``'s prediction for the same rank (:func:`memory_check`).

This process plays one rank of the layout on torch's fake process-group backend
(:func:`~shardcore.distributed.init_simulated_world`) with the model's tensors under
``FakeTensorMode`` (shapes, dtypes and devices, no data: a 70B rank costs this machine nothing).
``shardcore.optimize`` shards it as that rank holds it, then two training steps run (forward and
backward through :func:`~shardcore.pipeline_step`, the optimizer's step, ``zero_grad``) under
PyTorch's own memory tracker (``torch.distributed._tools.mem_tracker.MemTracker``), which counts
every tensor's storage by what it is (parameter, gradient, optimizer state, activation, temporary).
The second step is the steady one (the optimizer's state exists), so the peak is its peak.

Measured, in bytes: ``parameters`` the rank holds, ``gradients`` after its backward,
``optimizer`` state after its step, ``activations`` (activations and temporaries at the peak) and
``total``: the tracked peak. The tracker counts what the model allocates on the device it runs on
(here the CPU's kernels: attention through SDPA's math path keeps its score matrix, which a GPU's
flash kernel does not); allocator rounding, workspaces and communication buffers are not in it. The
batch has no padding, and the model's mask builders are told so (the attention registry's ``unpadded``):
a fake tensor cannot be read, and transformers would build the whole causal mask a real run skips.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch
import torch.distributed as dist
from torch import nn

from ..config import ShardConfig
from ..distributed import ParallelLayout
from ..distributed.simulate import init_simulated_world
from .elementwise import unpadded as _unpadded

__all__ = ["CATEGORIES", "memory_check", "predicted_memory", "tracked_memory"]

#: what is measured and predicted, in this order
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "total")


def _world(config: ShardConfig) -> int:
    dims = (config.tensor_parallel_size, config.pipeline_parallel_size, config.sequence_parallel_size)
    return dims[0] * dims[1] * dims[2] * (config.data_parallel_size or 1)


def cost_layout(config: ShardConfig) -> dict:
    """The layout the cost model reads for ``config`` (its ``data_parallel_size`` given or 1)."""
    dp = config.data_parallel_size or 1
    return dict(
        dp=dp,
        pp=config.pipeline_parallel_size,
        sp=config.sequence_parallel_size,
        tp=config.tensor_parallel_size,
        ep=config.expert_parallel_size,
        mode=(config.sequence_parallelism_mode or "split_gather") if config.enable_sequence_parallelism else None,
        data_parallel=config.data_parallel if dp > 1 else None,
        microbatches=config.num_microbatches or 1 if config.pipeline_parallel_size > 1 else 1,
        **({"shard": config.data_parallel_shard_size} if dp > 1 and config.data_parallel == "hsdp" else {}),
    )


def _faked(model: nn.Module, fake) -> nn.Module:
    """``model`` (built on the meta device) with every parameter and buffer a fake CPU tensor."""
    from ..checkpoint.materialize import replace_tensors

    with fake:
        swapped: dict[int, torch.Tensor] = {}
        for p in model.parameters():
            swapped.setdefault(id(p), nn.Parameter(torch.empty_like(p, device="cpu"), requires_grad=p.requires_grad))
        for b in model.buffers():
            swapped.setdefault(id(b), torch.empty_like(b, device="cpu"))
    replace_tensors(model, swapped)
    return model


def _tracker():
    """PyTorch's ``MemTracker``, letting a module be called again at the top within a step (a pipeline
    stage, once per microbatch; ``MemTracker`` takes that for a second iteration and refuses): that
    module's own record starts again. The counts by kind and the peak are the tracker's, unchanged."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class _PerMicrobatch(MemTracker):
        def _pre_fw_hook(self, module: nn.Module, inputs) -> None:
            mods = self._mod_tracker
            if module in self.memory_tracking and not mods.is_bw:
                if set(mods.parents) - {mods.get_known_fqn(module)} == {"Global"}:
                    del self.memory_tracking[module]
            super()._pre_fw_hook(module, inputs)

    return _PerMicrobatch()


def _optimizer(name: str, params) -> torch.optim.Optimizer | None:
    if name == "none":
        return None
    return {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[name](params, lr=1e-4)


def _bytes(tensors) -> int:
    """What ``tensors`` hold on this rank (a DTensor: its local shard)."""
    local = (t.to_local() if hasattr(t, "to_local") else t for t in tensors if t is not None)
    return sum(t.numel() * t.element_size() for t in local)


def tracked_memory(
    build: Callable[[], nn.Module],
    config: ShardConfig,
    *,
    seq: int,
    batch: int,
    rank: int = 0,
    optimizer: str = "adamw",
    vocab: int | None = None,
) -> dict[str, int]:
    """Bytes rank ``rank`` of ``config``'s layout holds through a training step on ``batch``
    sequences of ``seq`` tokens (its data-parallel part: ``batch // dp``), measured as the module's
    docstring says. ``build()`` returns the model on the meta device (``shardcore.init_empty()``);
    ``vocab``: the token ids' range (default: the model config's ``vocab_size``). Needs a process
    without ``torch.distributed`` initialized; leaves it so."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..pipeline import pipeline_step
    from ..steps import shard

    world = _world(config)
    init_simulated_world(rank, world)  # refuses a process with a group already
    try:
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        model = build()
        vocab = vocab or getattr(getattr(model, "config", None), "vocab_size", None)
        if not vocab:
            raise ValueError("tracked_memory: the model's config has no vocab_size; pass vocab=")
        with fake:
            ids = torch.randint(0, vocab, (max(1, batch // (config.data_parallel_size or 1)), seq))
        inputs = {"input_ids": ids, "labels": ids}
        if config.pipeline_parallel_size > 1 and config.example_inputs is None:  # a simulated stage's shapes
            config = attrs.evolve(config, example_inputs=inputs)
        model = shard(_faked(model, fake), config)  # as this rank holds it
        opt = _optimizer(optimizer, [p for p in model.parameters() if p.requires_grad])
        tracker, grads = _tracker(), 0
        tracker.track_external(model, *([opt] if opt is not None else []))
        with tracker, _unpadded(model):  # the batch has no padding: masks skipped as a run reading it skips them
            for _ in range(2):  # the second step is the steady one: the optimizer's state is there
                tracker.reset_mod_stats()  # its per-module records, one pass each (the peak stays)
                pipeline_step(model, inputs)
                grads = max(grads, _bytes(p.grad for p in model.parameters()))
                if opt is not None:
                    opt.step()
                    opt.zero_grad(set_to_none=True)
        at_peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
        kinds = {str(k.value) if hasattr(k, "value") else str(k): v for k, v in at_peak.items()}
        states = opt.state.values() if opt is not None else ()
        return {
            "parameters": _bytes(model.parameters()),
            "gradients": grads,
            "optimizer": _bytes(t for state in states for t in state.values() if torch.is_tensor(t) and t.dim()),
            "activations": int(kinds.get("Activation", 0) + kinds.get("Temp", 0) + kinds.get("Other", 0)),
            "total": int(kinds["Total"]),
        }
    finally:
        dist.destroy_process_group()


def predicted_memory(
    model: nn.Module, config: ShardConfig, *, seq: int, batch: int, rank: int = 0, optimizer: str = "adamw"
) -> dict[str, int]:
    """``explain``'s bytes for rank ``rank`` of ``config``'s layout (its pipeline stage's), on the meta
    ``model`` (left as it is): the cost model's :func:`~shardcore.cost.memory_per_rank`."""
    from .model import memory_per_rank
    from .search import workload_facts

    layout = cost_layout(config)
    stage = ParallelLayout.from_config(config, world_size=_world(config))
    defaults = ShardConfig()  # the layout's own fields come from ``layout`` (the tensor-parallel-only build too)
    base = attrs.evolve(
        config,
        enable_sequence_parallelism=defaults.enable_sequence_parallelism,
        sequence_parallelism_mode=defaults.sequence_parallelism_mode,
    )
    facts = workload_facts(model, layout, seq=seq, batch=batch, base=base)
    row = memory_per_rank(facts, layout, optimizer, index=stage.coordinates(rank)["pp"])
    return {key: row[key] for key in CATEGORIES}  # ZeRO-2's gathered weights: in the peak, as in the tracker's


def memory_check(
    build: Callable[[], nn.Module],
    config: ShardConfig,
    *,
    seq: int,
    batch: int,
    rank: int = 0,
    optimizer: str = "adamw",
    cap_gb: float | None = None,
) -> dict[str, dict]:
    """Per category (:data:`CATEGORIES`): ``{"predicted", "measured", "error"}`` for one rank, the
    error relative to the measured bytes (positive: predicted above). With ``cap_gb`` (what a device
    holds, GiB), ``"fits"``: ``{"cap", "predicted", "measured"}``, whether each peak is under the cap."""
    predicted = predicted_memory(build(), config, seq=seq, batch=batch, rank=rank, optimizer=optimizer)
    measured = tracked_memory(build, config, seq=seq, batch=batch, rank=rank, optimizer=optimizer)
    out = {
        key: {
            "predicted": predicted[key],
            "measured": measured[key],
            "error": (predicted[key] - measured[key]) / measured[key] if measured[key] else None,
        }
        for key in CATEGORIES
    }
    if cap_gb is not None:
        cap = int(cap_gb * 2**30)
        out["fits"] = {"cap": cap, "predicted": predicted["total"] <= cap, "measured": measured["total"] <= cap}
    return out
