"""PEFT LoRA on tensor-parallel linear layers, sharded the way Megatron-style LoRA is.

A LoRA adapter adds ``B A x`` (``A``: ``[r, in]``, ``B``: ``[out, r]``) beside a linear layer.
On a parallel layer (peft's own LoRA layer wraps it, its modules and names unchanged):

* **column-parallel** (output features split): ``A`` is replicated, ``B`` split by the layer's
  own spec (heads, replicated KV heads and padding included). Each rank's ``B_r^T dy_r`` is a
  partial sum, so ``A``'s gradient is all-reduced over the group; when the layer copies its input
  into the tensor-parallel region itself, the adapter's input is copied too (its gradient
  all-reduced), else the region's entry does it for both. Replicated rows of ``B`` have their
  gradient summed over their replica group, as the layer's own weight.
* **row-parallel** (input features split): ``A`` split by the layer's input spec, ``B``
  replicated: ``A_r x_r`` is all-reduced in forward (nothing in backward), then ``B`` runs on
  every rank alike.

``merge`` works unchanged: ``B_r A`` (column) and ``B A_r`` (row) are exactly this rank's slice of
the merged weight. The sliced adapter tensors record their spec (``shard_specs``) so gathering
(:func:`shardcore.full_named_tensors`), the gradient norm and the checkpoints see them whole.

Both orders reach :func:`shard_lora_layer`: LoRA first, then ``optimize`` (the sharder finds
peft's layer where a policy names a linear layer and shards its base), or ``optimize`` first, then
``get_peft_model`` (the parallel layers are ``nn.Linear`` to peft, which wraps them with full-sized
adapters; :func:`watch_adapters` slices them in place — same ``Parameter`` objects — the moment
peft puts its layer into the sharded model, so ``merge_and_unload`` is right before any forward;
:func:`shard_new_adapters`, run before every forward while peft is imported, catches adapters
added to a layer peft had wrapped already, ``add_adapter``).
"""

from __future__ import annotations

import sys
import weakref

import torch
from torch import nn

from ...config import SHARDED_MODES
from ...tensor_parallel.grad_sum import summed_over
from ...tensor_parallel.linear import Linear1D_Col, Linear1D_Row, sum_replica_rows
from ...tensor_parallel.mappings import copy_to_tp, reduce_from_tp, split_to_tp
from ...tensor_parallel.parallel_module import ParallelModule
from ...tensor_parallel.rng import run_in_shared_rng, run_in_tp_rng

__all__ = [
    "check_lora",
    "is_lora_layer",
    "peft_base_model",
    "shard_lora_layer",
    "shard_new_adapters",
    "watch_adapters",
]

_DONE = "_shardcore_lora"


def is_lora_layer(module: nn.Module) -> bool:
    """A peft LoRA layer (it wraps ``base_layer`` and holds ``lora_A`` / ``lora_B`` adapters)."""
    return hasattr(module, "base_layer") and isinstance(getattr(module, "lora_A", None), nn.ModuleDict)


def peft_base_model(model: nn.Module) -> nn.Module | None:
    """The model a PEFT wrapper (``PeftModel``) wraps, or ``None`` for any other model."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) and hasattr(model, "peft_config") else None


def check_lora(model: nn.Module, config, plan=(), *, adding: bool = False) -> None:
    """Refuse LoRA adapters where they are not built yet, by name, before any collective: beside
    FSDP (DDP is built: adapters added before ``optimize``), pipeline stages or sequence parallelism, and (``plan``: the sharder's
    ``(name, module, description)`` list) on a layer a policy turns into anything but a column- or
    row-parallel ``nn.Linear``, or with DoRA. ``adding``: a LoRA layer is being set into the model."""
    if not adding and not any(is_lora_layer(m) for m in model.modules()):
        return
    if config.pipeline_parallel_size > 1 or config.enable_sequence_parallelism:
        raise NotImplementedError(
            f"LoRA adapters on a sharded {type(model).__name__} with pipeline_parallel_size="
            f"{config.pipeline_parallel_size}, enable_sequence_parallelism={config.enable_sequence_parallelism}: "
            "not supported yet; use tensor (and data) parallelism"
        )
    if config.data_parallel in SHARDED_MODES:
        raise NotImplementedError(
            f"LoRA adapters on a sharded {type(model).__name__} with data_parallel={config.data_parallel!r}: the "
            "adapters' tensor-parallel gradient sums hook their parameters, which FSDP replaces (measured: wrong "
            "adapter gradients); use data_parallel='ddp' (the adapters are small: FSDP saves little on them)"
        )
    if config.data_parallel is not None and adding:
        raise NotImplementedError(
            f"LoRA adapters added to a {type(model).__name__} already wrapped by data_parallel="
            f"{config.data_parallel!r}: the data-parallel engine only reduces the gradients of the parameters it "
            "wrapped; add the adapters first (peft.get_peft_model), then shardcore.optimize"
        )
    for name, module, desc in plan:
        for sub in desc.sub_module_replacement:
            layer = getattr(module, sub.suffix, None) if "." not in sub.suffix else module.get_submodule(sub.suffix)
            if layer is not None and is_lora_layer(layer):
                where = f"{name}.{sub.suffix}" if name else sub.suffix
                target = sub.target_module
                if not issubclass(target, (Linear1D_Col, Linear1D_Row)) or getattr(target, "transposed", False):
                    raise NotImplementedError(
                        f"LoRA on {where}: the policy makes it a {target.__name__}; shardcore shards LoRA on "
                        "column- and row-parallel nn.Linear layers only; leave it out of target_modules"
                    )
                if any(getattr(layer, "use_dora", {}).values()):
                    raise NotImplementedError(
                        f"LoRA on {where}: DoRA (use_dora=True) is not supported on a sharded layer"
                    )


def _refuse(layer: nn.Module, base: nn.Module, where: str) -> None:
    if not isinstance(base, (Linear1D_Col, Linear1D_Row)) or getattr(base, "transposed", False):
        raise NotImplementedError(
            f"LoRA on {where} ({type(base).__name__}): shardcore shards LoRA on column- and row-parallel "
            "nn.Linear layers only; leave this module out of target_modules"
        )
    if base.sequence is not None:
        raise NotImplementedError(
            f"LoRA on {where}: not supported with sequence parallelism yet; shard without it or leave the module out"
        )
    if any(getattr(layer, "use_dora", {}).values()):
        raise NotImplementedError(f"LoRA on {where}: DoRA (use_dora=True) is not supported on a sharded layer")


def _column(a: nn.Linear, b: nn.Linear, base: Linear1D_Col, dropout: nn.Module, where: str) -> None:
    group, spec = base.process_group, base.spec
    with torch.no_grad():
        b.weight.data = spec.shard(b.weight.data, base.tp_rank)
        if b.bias is not None:
            b.bias.data = spec.shard(b.bias.data, base.tp_rank)
    b.process_group, b.shard_specs = group, {"weight": spec, **({"bias": spec} if b.bias is not None else {})}
    a.weight.register_hook(summed_over(group, f"backward of {where}.lora_A (replicated, partial gradients)"))
    if base._replica_groups is not None:  # replicated KV rows: their gradient summed over the replicas
        groups, at = base._replica_groups, f"backward of {where}.lora_B (replicated KV rows)"
        b.weight.register_hook(lambda g: sum_replica_rows(g, spec, groups, at))
    if base.copy_input:
        a.register_forward_pre_hook(lambda m, args: (copy_to_tp(args[0], group), *args[1:]))
    if isinstance(dropout, nn.Dropout) and dropout.p > 0:
        run_in_shared_rng(dropout)  # the same mask on every rank: the input is replicated
    _whole_in_state_dicts(b, base.tp_rank)


def _row(a: nn.Linear, b: nn.Linear, base: Linear1D_Row, dropout: nn.Module, where: str) -> None:
    group, spec = base.process_group, base.spec
    with torch.no_grad():
        a.weight.data = spec.shard(a.weight.data, base.tp_rank)
    a.process_group, a.shard_specs = group, {"weight": spec}
    if not base.input_is_parallel:
        a.register_forward_pre_hook(lambda m, args: (split_to_tp(args[0], group, dim=-1), *args[1:]))
    a.register_forward_hook(lambda m, args, out: reduce_from_tp(out, group))
    if isinstance(dropout, nn.Dropout) and dropout.p > 0:
        run_in_tp_rng(dropout, group)  # each rank masks its own slice of the input
    _whole_in_state_dicts(a, base.tp_rank)


def _whole_in_state_dicts(module: nn.Module, rank: int) -> None:
    """The sharded adapter appears whole in ``state_dict()`` (gathered: a collective over its group)
    and is cut to this rank's slice by ``load_state_dict`` when given whole: peft's adapter files
    are the unsharded model's, in both directions."""

    def gather(mod, state_dict, prefix, local_metadata):
        for name, spec in mod.shard_specs.items():
            if prefix + name in state_dict:
                state_dict[prefix + name] = spec.gather(state_dict[prefix + name], mod.process_group)

    def cut(mod, state_dict, prefix, *args):
        for name, spec in mod.shard_specs.items():
            full = state_dict.get(prefix + name)
            if full is not None and full.shape[spec.dim] == spec.full_size != spec.local_size:
                state_dict[prefix + name] = spec.shard(full, rank)

    module.register_state_dict_post_hook(gather)
    module.register_load_state_dict_pre_hook(cut)


def shard_lora_layer(layer: nn.Module, where: str = "a LoRA layer") -> None:
    """Shard every adapter of peft LoRA ``layer`` (whose ``base_layer`` is a parallel layer) not
    sharded yet, in place."""
    base = layer.base_layer
    for name, a in layer.lora_A.items():
        if getattr(a, _DONE, False):
            continue
        _refuse(layer, base, where)
        b, dropout = layer.lora_B[name], layer.lora_dropout[name]
        if isinstance(base, Linear1D_Col):
            _column(a, b, base, dropout, where)
        else:
            _row(a, b, base, dropout, where)
        setattr(a, _DONE, True)


def shard_new_adapters(model: nn.Module) -> None:
    """Shard the adapters peft added around ``model``'s parallel layers since the last call."""
    if "peft" not in sys.modules:  # peft never imported: no adapter can exist
        return
    new = [
        (name, m)
        for name, m in model.named_modules()
        if is_lora_layer(m)
        and isinstance(m.base_layer, ParallelModule)
        and not all(getattr(a, _DONE, False) for a in m.lora_A.values())
    ]
    if new:
        check_lora(model, model.shardcore.config)
    for name, module in new:
        shard_lora_layer(module, name)


_WATCH = None
#: the sharded models the registration hook is installed for: removed when the last is gone
_WATCHED: weakref.WeakSet = weakref.WeakSet()


def watch_adapters(model: nn.Module) -> None:
    """While ``model`` (or another sharded model) lives, torch's module-registration hook shards a
    peft LoRA layer the moment peft sets it into a sharded model (``get_peft_model`` after
    ``optimize``); the hook is removed when the last such model is garbage-collected, so nothing
    of it outlives them. It returns at once for any other module (one ``sys.modules`` lookup while
    peft is not imported, two attribute checks when it is)."""
    global _WATCH
    _WATCHED.add(model)
    weakref.finalize(model, _unwatch)
    if _WATCH is None:
        _WATCH = torch.nn.modules.module.register_module_module_registration_hook(_on_registration)


def _unwatch() -> None:
    global _WATCH
    if _WATCH is not None and not any(True for _ in _WATCHED):  # the WeakSet holds live models only
        _WATCH.remove()
        _WATCH = None


def watching() -> bool:
    """Whether the registration hook is installed now (a sharded model with tensor parallelism lives)."""
    return _WATCH is not None


def _on_registration(parent: nn.Module, name: str, sub) -> None:
    if "peft" not in sys.modules or not isinstance(sub, nn.Module) or not is_lora_layer(sub):
        return None
    if not isinstance(sub.base_layer, ParallelModule):
        return None
    from ...grad_norm import sharded_models

    for model in sharded_models():
        if any(m is parent for m in model.modules()):
            check_lora(model, model.shardcore.config, adding=True)  # by name, before any collective
            shard_lora_layer(sub, name)
            break
    return None
