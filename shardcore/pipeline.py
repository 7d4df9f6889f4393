"""Pipeline parallelism on the mesh's ``pp`` dimension, on ``torch.distributed.pipelining``, with
the model's own forward.

A stage is the model itself with what other stages hold taken out: the blocks of
:meth:`shardcore.Policy.blocks` outside the stage's range become :class:`PipelineHole` modules
(no parameters; they hand their input through), and the modules only the first stage runs (the
embedding) or only the last (the final norm, the head) become holes elsewhere
(:meth:`shardcore.Policy.pipeline_ends`). Nothing is renamed: a held parameter keeps its
unsharded name (``model.layers.5.mlp.up_proj.weight``), so optimizers, checkpoints and
:func:`shardcore.full_named_tensors` work as before. The policy says how the model runs on one
stage's inputs (:meth:`shardcore.Policy.pipeline_stage_forward`: for a HuggingFace decoder, the
hidden states enter later stages as ``inputs_embeds``) and how a microbatch's loss is weighed
(:meth:`shardcore.Policy.pipeline_loss`), so that the loss of the whole batch is the unsharded
model's even when microbatches hold different numbers of label tokens.

:func:`pipeline_step` runs one training step over the microbatches with the configured schedule
and returns the loss on every rank; on a model without pipeline parallelism it is
``model(**batch).loss.backward()``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import attrs
import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "PipelineHole",
    "PipelineInfo",
    "build_pipeline",
    "check_pipeline",
    "pipeline_step",
    "schedule_names",
    "split_layers",
    "tensor_aliases",
]

#: Schedules with one stage per rank; the others (multi-stage) run ``stages_per_rank`` stages each.
_SINGLE = ("GPipe", "1F1B")
_DEFAULT_SCHEDULE = "1F1B"


def schedule_names() -> list[str]:
    """The schedules ``torch.distributed.pipelining`` offers in the installed torch."""
    from torch.distributed.pipelining import schedules

    candidates = [
        "GPipe",
        "1F1B",
        "Interleaved1F1B",
        "LoopedBFS",
        "InterleavedZeroBubble",
        "ZBVZeroBubble",
        "DualPipeV",
    ]
    out = []
    for name in candidates:
        try:
            schedules.get_schedule_class(name)
        except ValueError:
            continue
        out.append(name)
    return out


def _schedule_class(name: str):
    from torch.distributed.pipelining import schedules

    return schedules.get_schedule_class(name)


def _is_single(name: str) -> bool:
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    return issubclass(_schedule_class(name), PipelineScheduleSingle)


def split_layers(num_blocks: int, num_stages: int) -> list[int]:
    """An even split of ``num_blocks`` over ``num_stages`` (the first stages take one more)."""
    base, extra = divmod(num_blocks, num_stages)
    return [base + (1 if s < extra else 0) for s in range(num_stages)]


class PipelineHole(nn.Module):
    """What stands in a stage for a module another stage holds: no parameters; its forward hands
    its first input (the hidden states) through, as a tuple when the module it replaces returned
    one (``as_tuple``), or, with ``zero``, a zero to add (a skipped position embedding). Simple attributes of the replaced module (``attention_type``, ...) are kept,
    so the model's forward reads them as before."""

    def __init__(
        self, replaced: nn.Module | None = None, *, as_tuple: bool = False, where: str = "", zero: bool = False
    ) -> None:
        super().__init__()
        self.as_tuple, self.where, self.zero = as_tuple, where, zero
        for key, value in (vars(replaced) if replaced is not None else {}).items():
            if not key.startswith("_") and key not in ("training", "as_tuple", "where", "zero"):
                if isinstance(value, str | int | float | bool | type(None)):
                    setattr(self, key, value)
        # what the model's forward may still read of the replaced module (ViT reads the patch
        # projection's dtype before its embedding runs): its submodules and tensors on meta, no memory
        self.__dict__["_stand_in"] = _stand_in(replaced, zero) if replaced is not None else None

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            stand_in = self.__dict__.get("_stand_in")
            if stand_in is None or not hasattr(stand_in, name):
                raise
            return getattr(stand_in, name)

    def forward(self, *args, **kwargs):
        # the hidden states: the first positional argument, or by keyword (an embedding module
        # skipped on a later stage is called with inputs_embeds=...)
        hidden = args[0] if args else kwargs.get("hidden_states", kwargs.get("inputs_embeds"))
        if self.zero:  # a term added to the hidden states (a position embedding): nothing to add
            hidden = torch.zeros(())
        return (hidden,) if self.as_tuple else hidden

    def extra_repr(self) -> str:
        return f"held by another pipeline stage: {self.where}"


def _stand_in(module: nn.Module, zero: bool = False):
    """``module``'s attribute tree with its parameters and buffers as meta tensors (shape and dtype
    only), its submodules likewise, its simple attributes as they are. ``zero``: a term the model
    adds, whose tensors it may read directly (transformers 4.x Whisper adds
    ``embed_positions.weight``): they are zero scalars."""
    import types

    out = types.SimpleNamespace()
    for key, value in vars(module).items():
        if not key.startswith("_") and isinstance(value, str | int | float | bool | tuple | type(None)):
            setattr(out, key, value)
    for key, t in (*module._parameters.items(), *module._buffers.items()):
        if t is not None:
            setattr(out, key, torch.zeros((), dtype=t.dtype) if zero else torch.empty_like(t, device="meta"))
    for key, child in module._modules.items():
        if child is not None:
            setattr(out, key, _stand_in(child, zero))
    return out


@attrs.define
class PipelineInfo:
    """The pipeline of a model on this rank: ``model.shardcore.pipeline``."""

    schedule_name: str
    num_stages: int
    stage_indices: list[int]  # the stages this rank runs
    layers: list[int]  # blocks per stage
    group: Any
    num_microbatches: int
    stages: list = attrs.field(factory=list)  # torch PipelineStage objects
    schedule: Any = None
    tied: list = attrs.field(factory=list)  # (parameter, group) whose gradients are summed over first/last stages
    last_stage_rank: int = 0  # in the pp group
    num_items: Any = None  # the loss terms of the batch in flight (pipeline_step sets it)
    shapes: Any = None  # the input shapes the stages were built for
    rebuild: Any = None
    #: ``{name: [other names]}`` of parameters the unsharded model holds under several names (tied
    #: embeddings): a stage may hold one under a name a checkpoint stores under another.
    aliases: dict = attrs.field(factory=dict)

    @property
    def is_first(self) -> bool:
        return 0 in self.stage_indices

    @property
    def is_last(self) -> bool:
        return self.num_stages - 1 in self.stage_indices


def check_pipeline(model: nn.Module, policy, config, layout) -> tuple[str, list[int], int]:
    """Check the pipeline ``config`` asks for, before any collective (the same on every rank).

    Returns ``(schedule name, blocks per stage, stages per rank)``.
    """
    pp = layout.pp
    name = config.pipeline_schedule or _DEFAULT_SCHEDULE
    valid = schedule_names()
    if name not in valid:
        raise ValueError(
            f"ShardConfig.pipeline_schedule={name!r} is not a schedule of this torch "
            f"({torch.__version__}); choose one of {', '.join(valid)}"
        )
    single = _is_single(name)
    per_rank = 1 if single else (config.pipeline_stages_per_rank or 2)
    if single and config.pipeline_stages_per_rank not in (None, 1):
        raise ValueError(
            f"ShardConfig(pipeline_schedule={name!r}) runs one stage per rank, but pipeline_stages_per_rank="
            f"{config.pipeline_stages_per_rank}; use a multi-stage schedule "
            f"({', '.join(n for n in valid if n not in _SINGLE)}) or leave pipeline_stages_per_rank unset"
        )
    if not single and per_rank < 2:
        raise ValueError(
            f"ShardConfig(pipeline_schedule={name!r}) is a multi-stage schedule: it needs at least 2 stages per "
            f"rank, got pipeline_stages_per_rank={per_rank}; use GPipe or 1F1B for one stage per rank"
        )
    if name in ("ZBVZeroBubble", "DualPipeV") and per_rank != 2:
        raise ValueError(f"ShardConfig(pipeline_schedule={name!r}) runs exactly 2 stages per rank (a V shape)")
    from .policy import Policy

    hooks = ("pipeline_ends", "pipeline_inputs", "pipeline_stage_forward", "pipeline_num_items", "pipeline_loss")
    missing = [h for h in (*hooks, "pipeline_output") if getattr(type(policy), h) is getattr(Policy, h)]
    try:
        if missing:  # found now, not at the first step, where one rank's error would leave the others waiting
            raise NotImplementedError(f"{type(policy).__name__} does not implement {', '.join(missing)}")
        policy.pipeline_ends()
    except NotImplementedError as err:
        raise NotImplementedError(
            f"{type(model).__name__}: {type(policy).__name__} does not support pipeline parallelism ({err}); "
            "leave pipeline_parallel_size=1"
        ) from None
    if config.parallel_output:
        raise NotImplementedError(
            "ShardConfig(parallel_output=True) with pipeline parallelism: the last stage computes the loss on "
            "full logits; leave parallel_output=False"
        )
    if config.tensor_parallel_process_group is not None:
        raise ValueError(
            "pipeline parallelism runs on shardcore's device mesh, but a tensor_parallel_process_group was given; "
            "leave it out and let the parallel sizes cut the world"
        )
    if config.data_parallel is not None:
        raise NotImplementedError(
            f"ShardConfig(data_parallel={config.data_parallel!r}) together with pipeline parallelism is not "
            "built yet; use one of them"
        )
    blocks = len(policy.blocks())
    stages = pp * per_rank
    if stages > blocks:
        raise ValueError(
            f"{type(model).__name__} has {blocks} blocks, fewer than the {stages} pipeline stages "
            f"(pipeline_parallel_size={pp}" + (f" x {per_rank} stages per rank" if per_rank > 1 else "") + "); "
            "lower the pipeline degree"
        )
    if config.pipeline_layers is not None:
        layers = list(config.pipeline_layers)
        if len(layers) != stages or sum(layers) != blocks or min(layers) < 1:
            raise ValueError(
                f"ShardConfig.pipeline_layers={layers}: give {stages} numbers of blocks, each at least 1, "
                f"summing to the model's {blocks} blocks (got {len(layers)} numbers summing to {sum(layers)})"
            )
    else:
        layers = split_layers(blocks, stages)
    return name, layers, per_rank


def _stage_indices(pp_rank: int, pp: int, per_rank: int, name: str) -> list[int]:
    if per_rank == 1:
        return [pp_rank]
    if name in ("ZBVZeroBubble", "DualPipeV"):  # V shape: rank r holds stages r and 2P-1-r
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(per_rank)]  # looped: rank r holds r, r+P, ...


class _Stage(nn.Module):
    """One stage as ``torch.distributed.pipelining`` runs it: the (pruned) model and how it runs.

    Its parameters (what the schedule computes weight gradients for) are its own: the modules
    ``own`` (its blocks, and the embedding / final norm and head on the first / last stage); the
    model is referenced, not registered. A rank running several stages holds the blocks of all
    of them; while one stage runs, the blocks of its other stages are swapped for holes
    (``others``), so each stage runs its own."""

    def __init__(
        self, model: nn.Module, policy, first: bool, last: bool, own: list, own_params: list, others: list
    ) -> None:
        super().__init__()
        self.own = nn.ModuleList(own)
        self.own_params = nn.ParameterList(own_params)
        object.__setattr__(self, "model", model)  # not a submodule: other stages' parameters are not ours
        self._policy, self._first, self._last = policy, first, last
        self._others = others  # (path, module, hole) of what this rank holds for its other stages

    def forward(self, *inputs):
        for name, _, hole in self._others:
            _set(self.model, name, hole)
        self.model._shardcore_in_stage = True
        try:
            out = self._policy.pipeline_stage_forward(tuple(inputs), first=self._first, last=self._last)
            # an input handed on unchanged (the encoder's states through decoder stages) is a new tensor:
            # its gradient from the next stage then flows back through this stage's autograd graph
            fresh = lambda t: t.clone() if any(t is i for i in inputs) else _own(t)  # noqa: E731
            return tuple(map(fresh, out)) if isinstance(out, tuple) else fresh(out)
        finally:
            self.model._shardcore_in_stage = False
            for name, block, _ in self._others:
                _set(self.model, name, block)


def _own(t: torch.Tensor) -> torch.Tensor:
    """A stage output as the schedule needs it: contiguous (it is sent as it lies in memory; an
    expanded position index is not) and not a view (the zero-bubble schedules detach outputs in
    place; GPT-2's hidden states are a view of its final norm's output)."""
    return t.clone(memory_format=torch.contiguous_format) if t._base is not None or not t.is_contiguous() else t


def _set(root: nn.Module, dotted: str, value: nn.Module) -> None:
    parent, _, name = dotted.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, value)


def build_pipeline(model: nn.Module, policy, config, layout, name: str, layers: list[int], per_rank: int):
    """Prune ``model`` to this rank's stages and build the stages and the schedule (collective:
    groups for tied weights). Called by :func:`shardcore.optimize` after tensor-parallel sharding."""
    pp, group = layout.pp, layout.group("pp")
    pp_rank = layout.coordinates(dist.get_rank())["pp"]
    indices = _stage_indices(pp_rank, pp, per_rank, name)
    num_stages = pp * per_rank
    starts = [sum(layers[:s]) for s in range(num_stages)]
    stage_blocks = {s: set(range(starts[s], starts[s] + layers[s])) for s in indices}
    held = set().union(*stage_blocks.values())
    blocks = policy.blocks()
    stage_of_block = {b: t for t in range(num_stages) for b in range(starts[t], starts[t] + layers[t])}

    # the ends: modules (or parameters) outside the blocks that one stage runs
    ends = policy.pipeline_ends()
    end_stage: dict[str, int] = {}
    param_ends: set[str] = set()
    for path, where in ends.items():
        index = {"first": 0, "last": -1}.get(where, where) if isinstance(where, str) else where
        if not isinstance(index, int) or not -len(blocks) <= index < len(blocks):
            raise ValueError(
                f"{type(policy).__name__}.pipeline_ends(): {path!r}: {where!r} is not 'first', 'last' or a block index"
            )
        end_stage[path] = stage_of_block[index % len(blocks)]
        try:
            model.get_submodule(path)
        except AttributeError:
            try:
                model.get_parameter(path)
            except AttributeError:
                raise ValueError(
                    f"{type(policy).__name__}.pipeline_ends(): {path!r} is neither a module nor a parameter of "
                    f"{type(model).__name__}"
                ) from None
            param_ends.add(path)

    # parameters the unsharded model holds under several names (tied embeddings), and the stages
    # holding each name: their gradients are summed over the ranks of those stages
    names_of: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(n)

    def stage_of(param_name: str) -> int | None:
        for path, stage in end_stage.items():
            if param_name == path or param_name.startswith(path + "."):
                return stage
        for b, (block_name, _) in enumerate(blocks):
            if param_name.startswith(block_name + "."):
                return stage_of_block[b]
        return None  # outside blocks and ends: every stage has it

    owners_of = {}
    for pid, names in names_of.items():
        stages = {stage_of(n) for n in names}
        if len(names) > 1 and None not in stages:
            owners = tuple(sorted({_stage_owner(t, pp, per_rank, name) for t in stages}))
            if len(owners) > 1:
                owners_of[pid] = owners
    aliases = {n: [m for m in names if m != n] for names in names_of.values() if len(names) > 1 for n in names}

    # prune: the blocks and the ends of other ranks' stages
    as_tuple = bool(getattr(policy, "pipeline_block_returns_tuple", False))
    holes = {
        b: PipelineHole(block, as_tuple=as_tuple, where=block_name) for b, (block_name, block) in enumerate(blocks)
    }
    for b, (block_name, _) in enumerate(blocks):
        if b not in held:
            _set(model, block_name, holes[b])
    zero_ends = policy.pipeline_zero_ends()
    end_holes = {
        path: PipelineHole(model.get_submodule(path), where=path, zero=path in zero_ends)
        for path in ends
        if path not in param_ends
    }
    for path in ends:
        if end_stage[path] in indices:
            continue
        if path in param_ends:  # gone from this rank; what reads its shape or dtype still can
            parent, _, leaf = path.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            stand_in = torch.empty_like(owner._parameters.pop(leaf), device="meta")
            object.__setattr__(owner, leaf, stand_in)
        else:
            _set(model, path, end_holes[path])

    # the ranks holding a tied parameter's stages sum its gradients, one group per (dp, sp, tp) coordinate
    tied: list = []
    if owners_of:
        coords = [layout.coordinates(r) for r in range(dist.get_world_size())]
        keys = sorted({(c["dp"], c["sp"], c["tp"]) for c in coords})
        groups = {}
        for owners in sorted(set(owners_of.values())):
            for key in keys:
                ranks = sorted(
                    r for r, c in enumerate(coords) if (c["dp"], c["sp"], c["tp"]) == key and c["pp"] in owners
                )
                g = dist.new_group(ranks)  # collective over the world: every rank creates every group
                if dist.get_rank() in ranks:
                    groups[owners] = g
        live = {id(p): p for p in model.parameters()}
        tied = [(live[pid], groups[owners]) for pid, owners in owners_of.items() if pid in live]
    last_owner = _stage_owner(num_stages - 1, pp, per_rank, name)

    info = PipelineInfo(
        schedule_name=name,
        num_stages=num_stages,
        stage_indices=indices,
        layers=layers,
        group=group,
        num_microbatches=config.num_microbatches or pp * per_rank,
        tied=tied,
        last_stage_rank=last_owner,
        aliases=aliases,
    )

    def make_stages() -> None:
        from torch.distributed.pipelining import PipelineStage

        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        info.stages = []
        for s in indices:
            others = [(blocks[b][0], blocks[b][1], holes[b]) for t in indices if t != s for b in stage_blocks[t]]
            own = [blocks[b][1] for b in sorted(stage_blocks[s])]
            own_params = []
            for path, stage in end_stage.items():
                if path in param_ends:
                    if stage == s:
                        own_params.append(model.get_parameter(path))
                elif stage == s:
                    own.append(model.get_submodule(path))
                elif stage in indices:  # this rank runs that end in another of its stages: a hole while this one runs
                    others.append((path, model.get_submodule(path), end_holes[path]))
            stage = _Stage(model, policy, s == 0, s == num_stages - 1, own, own_params, others)
            info.stages.append(PipelineStage(stage, s, num_stages, device, group=group))

        def loss_fn(output, target):
            return policy.pipeline_loss(output, target, info.num_items)

        info.schedule = _make_schedule(info, loss_fn)

    info.rebuild = make_stages
    try:
        make_stages()  # local: the schedule checks its own constraints (microbatches, stages) here
    except (ValueError, RuntimeError, AssertionError) as err:
        raise ValueError(
            f"ShardConfig(pipeline_schedule={name!r}, pipeline_parallel_size={pp}, num_microbatches="
            f"{info.num_microbatches}): torch.distributed.pipelining refuses it: {err}"
        ) from err

    _route_forward(model, policy, info)
    return info


def _route_forward(model: nn.Module, policy, info: PipelineInfo) -> None:
    """``model(...)`` outside a stage runs the whole pipeline forward (inference: no autograd across
    stages) and returns the model's outputs on every rank; ``generate()`` runs through it, without a
    KV cache (each step recomputes the sequence), its random state shared by the pipeline's ranks."""
    import functools

    original = model.forward

    @functools.wraps(original)  # generate() inspects the signature (position_ids, logits_to_keep)
    def forward(*args, **kwargs):
        if getattr(model, "_shardcore_in_stage", False):
            return original(*args, **kwargs)
        if model.training and torch.is_grad_enabled():
            raise RuntimeError(
                f"{type(model).__name__} is split into {info.num_stages} pipeline stages: train it with "
                "shardcore.pipeline_step(model, batch); a forward through the pipeline is for inference "
                "(model.eval(), or under torch.no_grad())"
            )
        return _forward_only(model, policy, info, args, kwargs)

    model.forward = forward
    generate = getattr(model, "generate", None)
    if callable(generate):

        @functools.wraps(generate)
        def generate_through_pipeline(*args, **kwargs):
            from .consistency import sync_random_state

            if policy.pipeline_generate_unsupported:
                raise NotImplementedError(
                    f"{type(model).__name__} in pipeline stages: {policy.pipeline_generate_unsupported}; "
                    "generate with a model sharded without pipeline_parallel_size"
                )
            if kwargs.get("use_cache"):
                raise ValueError(
                    "generate(use_cache=True) through pipeline stages: the KV cache is not split over stages "
                    "yet; leave use_cache unset (each step recomputes the sequence)"
                )
            kwargs["use_cache"] = False
            sync_random_state(info.group, next(model.parameters()).device)  # sampling alike on every stage
            return generate(*args, **kwargs)

        model.generate = generate_through_pipeline


def _send(tensors: tuple, peer: int, group) -> None:
    dst = dist.get_global_rank(group, peer)
    dist.send_object_list([[(tuple(t.shape), t.dtype) for t in tensors]], dst=dst, group=group)
    for t in tensors:
        dist.send(t.contiguous(), dst=dst, group=group)


def _recv(peer: int, group) -> tuple:
    src = dist.get_global_rank(group, peer)
    meta: list = [None]
    dist.recv_object_list(meta, src=src, group=group)
    out = []
    for shape, dtype in meta[0]:
        t = torch.empty(shape, dtype=dtype)
        dist.recv(t, src=src, group=group)
        out.append(t)
    return tuple(out)


def _forward_only(model: nn.Module, policy, info: PipelineInfo, args: tuple, kwargs: dict):
    """The whole batch through the stages in order; the last stage's output broadcast to every rank."""
    names = list(inspect.signature(model.forward).parameters)
    batch = {**dict(zip(names, args, strict=False)), **{k: v for k, v in kwargs.items() if v is not None}}
    logits_to_keep = batch.pop("logits_to_keep", 0)
    inputs, labels = policy.pipeline_inputs(batch, training=False)
    me = dist.get_group_rank(info.group, dist.get_rank())
    pp = dist.get_world_size(info.group)
    per_rank = len(info.stage_indices)
    owner = [_stage_owner(s, pp, per_rank, info.schedule_name) for s in range(info.num_stages)]
    stages = dict(zip(info.stage_indices, (st.submod for st in info.stages), strict=True))
    x = inputs
    with torch.no_grad():
        for s in range(info.num_stages):
            if owner[s] != me:
                continue
            if s > 0 and owner[s - 1] != me:
                x = _recv(owner[s - 1], info.group)
            out = stages[s](*x)
            x = out if isinstance(out, tuple) else (out,)
            if s < info.num_stages - 1 and owner[s + 1] != me:
                _send(x, owner[s + 1], info.group)
        x = tuple(t.contiguous() for t in x)  # a collective sends memory as it lies (logits may be a narrowed view)
        meta = [[(tuple(t.shape), t.dtype) for t in x]] if owner[-1] == me else [None]
        src = dist.get_global_rank(info.group, owner[-1])
        dist.broadcast_object_list(meta, src=src, group=info.group)
        if owner[-1] != me:
            x = tuple(torch.empty(shape, dtype=dtype) for shape, dtype in meta[0])
        for t in x:
            dist.broadcast(t, src=src, group=info.group)
        logits = x[0]
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            logits = logits[:, -logits_to_keep:]
        loss = None
        if labels is not None:
            loss = policy.pipeline_loss(x[0] if len(x) == 1 else x, labels, policy.pipeline_num_items(labels))
    return policy.pipeline_output(logits, loss, *x[1:])  # the last stage's further outputs, if any


def _stage_owner(stage: int, pp: int, per_rank: int, name: str) -> int:
    """The pp rank running ``stage``."""
    for r in range(pp):
        if stage in _stage_indices(r, pp, per_rank, name):
            return r
    raise AssertionError(f"stage {stage} has no rank")


def _make_schedule(info: PipelineInfo, loss_fn):
    cls = _schedule_class(info.schedule_name)
    stage = info.stages[0] if _is_single(info.schedule_name) else info.stages
    kwargs: dict[str, Any] = {"loss_fn": loss_fn}
    if "scale_grads" in inspect.signature(cls.__init__).parameters:
        kwargs["scale_grads"] = False  # each microbatch's loss is already weighed by the whole batch's terms
    return cls(stage, info.num_microbatches, **kwargs)


def pipeline_step(model: nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    """One training step's forward and backward over the whole ``batch`` (as the unsharded model
    would take it, labels included); the gradients are left accumulated in the parameters this
    rank holds, and the loss of the whole batch is returned on every rank.

    Under pipeline parallelism the batch is cut into ``num_microbatches`` microbatches run by the
    configured schedule; each microbatch's loss is weighed by the whole batch's number of loss
    terms, so the result equals the unsharded model's loss also when microbatches hold different
    numbers of label tokens. Without pipeline parallelism: ``model(**batch).loss.backward()``.
    """
    info = getattr(getattr(model, "shardcore", None), "pipeline", None)
    if info is None:
        out = model(**batch)
        loss = out["loss"] if isinstance(out, Mapping) else out.loss
        loss.backward()
        return loss.detach()
    policy = model.shardcore.policy
    if model.shardcore.config.inference_only:
        raise RuntimeError(
            f"{type(model).__name__} was sharded with ShardConfig(inference_only=True): its parameters are frozen; "
            "run model(**batch) for inference, or shard it without inference_only to train it"
        )
    args, labels = policy.pipeline_inputs(dict(batch))  # local checks first: the same on every rank
    if labels is None:
        raise ValueError("pipeline_step: the batch has no labels; a training step needs them")
    size = args[0].shape[0]
    if size % info.num_microbatches:
        raise ValueError(
            f"pipeline_step: batch size {size} is not divisible by num_microbatches={info.num_microbatches}; "
            "give a batch whose size is a multiple of it (or change num_microbatches)"
        )
    if model.shardcore.config.check_inputs:  # every rank of a pipeline (and of its TP groups) gets the same batch
        from .consistency import check_inputs

        layout = model.shardcore.layout
        for dim in ("pp", "tp"):
            if layout.degrees[dim] > 1:
                check_inputs(layout.group(dim), "pipeline_step", (), dict(batch))
    info.num_items = policy.pipeline_num_items(labels)
    shapes = tuple(tuple(a.shape) for a in args)
    device = next(model.parameters()).device
    if (info.shapes is not None and info.shapes != shapes) or info.stages[0].device != device:
        # torch's stages keep the shapes of their first step and the device they were built on (meta,
        # for a model built under init_empty and loaded since): new shapes or device, new stages
        info.rebuild()
    info.shapes = shapes
    losses: list[torch.Tensor] = []
    if info.is_first:
        info.schedule.step(*args, target=labels, losses=losses, return_outputs=False)
    else:
        info.schedule.step(target=labels, losses=losses, return_outputs=False)
    for param, group in info.tied:  # the input and output embeddings: one parameter, two stages
        if param.grad is not None:
            dist.all_reduce(param.grad, group=group)
    total = torch.stack([x.detach().float() for x in losses]).sum() if losses else torch.zeros(())
    src = dist.get_global_rank(info.group, info.last_stage_rank)
    dist.broadcast(total, src=src, group=info.group)
    return total


def tensor_aliases(model: nn.Module) -> dict[str, list[str]]:
    """The other names of each tied parameter of a pipelined model (``{}`` without a pipeline)."""
    info = getattr(getattr(model, "shardcore", None), "pipeline", None)
    return dict(info.aliases) if info is not None else {}
