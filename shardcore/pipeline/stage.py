"""A stage built from the model itself: the blocks and ends other stages hold become holes."""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch import nn

from ..attach import attached
from ..attach.stage import in_stage, running_stage
from .check import PipelineInfo, _stage_indices, pipeline_blocks
from .hole import PipelineHole
from .runtime import _forward_only, _make_schedule, _stage_owner
from .simulated import stage_shapes
from .tied import _tied, _tied_groups


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
        self._forward, self._first, self._last = policy.pipeline().stage_forward, first, last
        self._others = others  # (path, module, hole) of what this rank holds for its other stages

    @property
    def blocks(self) -> list[nn.Module]:
        """The stage's blocks (each its own unit under data parallelism), without its end modules."""
        return list(self.own)[: self.num_blocks]

    def forward(self, *inputs):
        for name, _, hole in self._others:
            _set(self.model, name, hole)
        try:
            with running_stage(self.model):
                out = self._forward(tuple(inputs), first=self._first, last=self._last)
            # an input handed on unchanged (the encoder's states through decoder stages) is a new tensor:
            # its gradient from the next stage then flows back through this stage's autograd graph
            fresh = lambda t: t.clone() if any(t is i for i in inputs) else _own(t)  # noqa: E731
            return tuple(map(fresh, out)) if isinstance(out, tuple) else fresh(out)
        finally:
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


def _ends(model: nn.Module, policy, blocks: list, stage_of_block: dict[int, int]) -> tuple[dict[str, int], set[str]]:
    """``({path: stage}, paths that name parameters)`` of :attr:`PipelineSpec.ends <shardcore.spec.PipelineSpec>`:
    the modules (or parameters) outside the blocks that one stage runs."""
    end_stage: dict[str, int] = {}
    param_ends: set[str] = set()
    for path, where in policy.pipeline().ends.items():
        index = {"first": 0, "last": -1}.get(where, where) if isinstance(where, str) else where
        if not isinstance(index, int) or not -len(blocks) <= index < len(blocks):
            raise ValueError(
                f"{type(policy).__name__}.pipeline().ends: {path!r}: {where!r} is not 'first', 'last' or a block index"
            )
        end_stage[path] = stage_of_block[index % len(blocks)]
        try:
            model.get_submodule(path)
        except AttributeError:
            try:
                model.get_parameter(path)
            except AttributeError:
                raise ValueError(
                    f"{type(policy).__name__}.pipeline().ends: {path!r} is neither a module nor a parameter of "
                    f"{type(model).__name__}"
                ) from None
            param_ends.add(path)
    return end_stage, param_ends


def _hf4(model: nn.Module) -> bool:
    """Whether ``model`` is a HuggingFace model under transformers 4.x, whose layers return ``(hidden, ...)``."""
    if not type(model).__module__.startswith("transformers."):
        return False
    import transformers  # the model is a transformers model: it is imported already

    return int(transformers.__version__.split(".")[0]) < 5


def _prune(model: nn.Module, policy, blocks: list, held: set[int], ends: tuple, indices: list[int]) -> tuple:
    """Holes in place of the blocks and ends of other ranks' stages; returns every block's and
    every end module's hole (a stage uses them for what another stage of this rank runs)."""
    end_stage, param_ends = ends
    spec = policy.pipeline()
    as_tuple = spec.block_returns_tuple if spec.block_returns_tuple is not None else _hf4(model)
    holes = {
        b: PipelineHole(block, as_tuple=as_tuple, where=block_name) for b, (block_name, block) in enumerate(blocks)
    }
    for b, (block_name, _) in enumerate(blocks):
        if b not in held:
            _set(model, block_name, holes[b])
    zero_ends = spec.zero_ends
    end_holes = {
        path: PipelineHole(model.get_submodule(path), where=path, zero=path in zero_ends)
        for path in end_stage
        if path not in param_ends
    }
    for path in end_stage:
        if end_stage[path] in indices:
            continue
        if path in param_ends:  # gone from this rank; what reads its shape or dtype still can
            parent, _, leaf = path.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            stand_in = torch.empty_like(owner._parameters.pop(leaf), device="meta")
            object.__setattr__(owner, leaf, stand_in)
        else:
            _set(model, path, end_holes[path])
    return holes, end_holes


def build_pipeline(model: nn.Module, policy, config, layout, name: str, layers: list[int], per_rank: int):
    """Prune ``model`` to this rank's stages and build the stages and the schedule (collective:
    groups for tied weights). Called by :func:`shardcore.optimize` after tensor-parallel sharding."""
    pp, group = layout.pp, layout.group("pp")
    indices = _stage_indices(layout.coordinates(dist.get_rank())["pp"], pp, per_rank, name)
    num_stages = pp * per_rank
    starts = [sum(layers[:s]) for s in range(num_stages)]
    stage_blocks = {s: set(range(starts[s], starts[s] + layers[s])) for s in indices}
    blocks = pipeline_blocks(policy)
    stage_of_block = {b: t for t in range(num_stages) for b in range(starts[t], starts[t] + layers[t])}
    ends = _ends(model, policy, blocks, stage_of_block)
    owners_of, aliases = _tied(model, blocks, ends[0], stage_of_block, lambda t: _stage_owner(t, pp, per_rank, name))
    static, shapes = stage_shapes(policy.pipeline(), config, pp * per_rank, group)  # fake backend: shapes first
    holes = _prune(model, policy, blocks, set().union(*stage_blocks.values()), ends, indices)
    info = PipelineInfo(
        schedule_name=name,
        num_stages=num_stages,
        stage_indices=indices,
        layers=layers,
        group=group,
        num_microbatches=config.num_microbatches or pp * per_rank,
        tied=_tied_groups(model, layout, owners_of),
        last_stage_rank=_stage_owner(num_stages - 1, pp, per_rank, name),
        aliases=aliases,
        spec=policy.pipeline(),
        static=static,
        shapes=shapes,
    )
    info.rebuild = functools.partial(_make_stages, model, policy, info, blocks, stage_blocks, ends, holes)
    try:
        info.rebuild()  # local: the schedule checks its own constraints (microbatches, stages) here
    except (ValueError, RuntimeError, AssertionError) as err:
        raise ValueError(
            f"ShardConfig(pipeline_schedule={name!r}, pipeline_parallel_size={pp}, num_microbatches="
            f"{info.num_microbatches}): torch.distributed.pipelining refuses it: {err}"
        ) from err
    _route_forward(model, info)
    return info


def _make_stages(model: nn.Module, policy, info: PipelineInfo, blocks, stage_blocks, ends, holes) -> None:
    """This rank's ``PipelineStage`` objects and the schedule over them (``info.rebuild``)."""
    PipelineStage = _pipeline_stage()
    indices, num_stages = info.stage_indices, info.num_stages
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    info.stages = []
    for s in indices:
        # rebuilt for new shapes: the same modules (data parallelism wraps them once)
        submod = (
            info.submods[s]
            if s in info.submods
            else _stage_module(model, policy, info, s, blocks, stage_blocks, ends, holes)
        )
        info.stages.append(PipelineStage(submod, s, num_stages, device, group=info.group, **info.static.get(s, {})))

    def loss_fn(output, target):
        loss = info.spec.loss(output, target, info.num_items)
        if info.loss_scale is None:
            return loss
        info.unscaled.append(loss.detach())  # what pipeline_step reports; the backward runs on the scaled one
        return info.loss_scale(loss)

    info.schedule = _make_schedule(info, loss_fn)


@functools.cache
def _pipeline_stage() -> type:
    """torch's ``PipelineStage``, the tensors it runs a stage on to learn its output shapes made zeros.

    torch runs each stage once, before the first microbatch, on tensors it makes from the shapes the
    stage before sends, and leaves them uninitialised. A stage that indexes a table with an integer
    input (CodeGen's ``embed_positions[position_ids]``) then reads an index out of range and raises on
    that rank alone, while the next stage waits for its shapes. Zeros index every table in range."""
    from torch.distributed.pipelining import PipelineStage

    class ZeroedStage(PipelineStage):
        def _to_tensor(self, arg):
            made = super()._to_tensor(arg)
            if not isinstance(arg, torch.Tensor):  # made from shapes, not the batch's own tensor
                with torch.no_grad():
                    made.zero_()
            return made

    return ZeroedStage


def _stage_module(model: nn.Module, policy, info: PipelineInfo, s: int, blocks, stage_blocks, ends, holes) -> _Stage:
    """Stage ``s``'s module: its blocks, its ends, and holes for what this rank runs in its other stages."""
    (end_stage, param_ends), (block_holes, end_holes) = ends, holes
    indices = info.stage_indices
    others = [(blocks[b][0], blocks[b][1], block_holes[b]) for t in indices if t != s for b in stage_blocks[t]]
    own = [blocks[b][1] for b in sorted(stage_blocks[s])]  # its blocks first: _Stage.blocks
    own_params = []
    for path, stage in end_stage.items():
        if path in param_ends:
            if stage == s:
                own_params.append(model.get_parameter(path))
        elif stage == s:
            own.append(model.get_submodule(path))
        elif stage in indices:  # this rank runs that end in another of its stages: a hole while this one runs
            others.append((path, model.get_submodule(path), end_holes[path]))
    stage = info.submods[s] = _Stage(model, policy, s == 0, s == info.num_stages - 1, own, own_params, others)
    stage.num_blocks = len(stage_blocks[s])
    return stage


def _route_forward(model: nn.Module, info: PipelineInfo) -> None:
    """``model(...)`` outside a stage runs the whole pipeline forward (inference: no autograd across
    stages) and returns the model's outputs on every rank; ``generate()`` runs through it, without a
    KV cache (each step recomputes the sequence), its random state shared by the pipeline's ranks."""

    def through_stages(original):
        @functools.wraps(original)  # generate() inspects the signature (position_ids, logits_to_keep)
        def forward(*args, **kwargs):
            if in_stage(model):
                return original(*args, **kwargs)
            if model.training and torch.is_grad_enabled():
                raise RuntimeError(
                    f"{type(model).__name__} is split into {info.num_stages} pipeline stages: train it with "
                    "shardcore.pipeline_step(model, batch); a forward through the pipeline is for inference "
                    "(model.eval(), or under torch.no_grad())"
                )
            return _forward_only(model, info, args, kwargs)

        return forward

    def generate_through(generate):
        @functools.wraps(generate)
        def generate_through_pipeline(*args, **kwargs):
            from ..consistency import sync_random_state

            if info.spec.generate_refusal:
                raise NotImplementedError(
                    f"{type(model).__name__} in pipeline stages: {info.spec.generate_refusal}; "
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

        return generate_through_pipeline

    attached(model).route(model, "forward", "pipeline", through_stages, what="the whole pipeline outside a stage")
    if callable(getattr(model, "generate", None)):
        attached(model).route(model, "generate", "pipeline", generate_through, what="no KV cache, sampling synced")
