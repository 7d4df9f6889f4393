"""Megatron-LM's sequence parallelism (``sequence_parallelism_mode="split_gather"``) on the
model's own forward: see :mod:`shardcore.sequence`.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from ..distributed import traced
from ..distributed.collectives import Pending, all_reduce, backward_of, start_all_gather
from ..pipeline import PipelineHole
from ..tensor_parallel.mappings import gather_from_tp, split_to_tp
from ..tensor_parallel.parallel_module import ParallelModule
from ..tensor_parallel.regions import SequenceParallel, storage_key
from ..tensor_parallel.rng import fork_tp_rng, in_tp_rng
from .check import _watch_forward, refuse_stacked
from .declared import regions


def apply_sequence_parallel(model: nn.Module, policy, state: SequenceParallel) -> None:
    """Split at the first block's input, gather at the last block's output (for each of
    :attr:`SequenceSpec.regions <shardcore.spec.SequenceSpec>`), and make the blocks' parallel layers,
    replicated parameters and dropouts follow ``state``. Called by :func:`shardcore.optimize`
    after the sharder (which gave the layers ``state``)."""
    _watch_forward(model, state)
    saving_now: list = []  # the saved-tensor hooks of the split running now
    # a replicated parameter the policy sums over the group already (a per-head norm inside the region,
    # applied to this rank's heads of every token): summing it again for the split would count it twice
    names = set(policy.tensor_parallel().grad_sum)
    summed = {id(p) for n, p in model.named_parameters(remove_duplicate=False) if n in names}
    for region in regions(policy):
        names, blocks = [name for name, _ in region], [block for _, block in region]
        _split_region(model, names, blocks, state, saving_now)
        for block in blocks:
            owners = []
            for module in block.modules():
                if isinstance(module, ParallelModule):
                    module.sequence = state
                partial = [
                    n
                    for n, p in module.named_parameters(recurse=False)
                    if p.requires_grad and n not in getattr(module, "shard_specs", {}) and id(p) not in summed
                ]
                if partial:
                    owners.append((module, partial))
            _token_sums(block, owners, state)
        _per_rank_dropouts(blocks, policy.sequence().dropouts, state)


def _split_region(model: nn.Module, names: list[str], blocks: list[nn.Module], state: SequenceParallel, saving_now):
    """The hooks that split the hidden states at the input of the first of ``blocks`` this process
    runs and gather them at the output of the last."""
    group = state.group

    def held(index: int) -> bool:
        """Whether block ``index`` runs here: on a pipeline stage the others are holes, and the split
        (the gather) goes with the first (the last) block this stage holds."""
        return 0 <= index < len(names) and not isinstance(model.get_submodule(names[index]), PipelineHole)

    def split(module, args, kwargs, index):
        if held(index - 1):
            return None  # a later block of the split: its input is split already
        in_kwargs = "hidden_states" in kwargs
        x = kwargs["hidden_states"] if in_kwargs else args[0]
        refuse_stacked(x, state, names[index])
        length = x.shape[state.dim]
        state.active = length % state.size == 0 and length >= state.size
        if not state.active:
            return None  # plain tensor parallelism for this forward (a decoding step, an odd length)
        x = split_to_tp(x, group, dim=state.dim)
        state.gathered.clear()
        state.latest_saved = None
        # autograd keeps the slices of gathered inputs, not the gathered tensors (unless a checkpoint keeps none)
        if torch.is_grad_enabled() and not state.checkpointing:
            saving = torch.autograd.graph.saved_tensors_hooks(*_regather_hooks(state))
            saving.__enter__()
            saving_now.append(saving)
        return (args, {**kwargs, "hidden_states": x}) if in_kwargs else ((x, *args[1:]), kwargs)

    def gather(module, args, output, index):
        if held(index + 1):
            return None  # the next block runs here too, on the split
        while saving_now:
            saving_now.pop().__exit__(None, None, None)
        state.gathered.clear()
        state.latest_saved = None
        if not state.active:
            return None
        state.active = False  # what follows the blocks (final norm, head) sees the whole sequence
        if isinstance(output, tuple):  # transformers 4.x layers: (hidden_states, ...)
            return (gather_from_tp(output[0], group, dim=state.dim), *output[1:])
        return gather_from_tp(output, group, dim=state.dim)

    for index, block in enumerate(blocks):
        block.register_forward_pre_hook(functools.partial(split, index=index), with_kwargs=True)
        block.register_forward_hook(functools.partial(gather, index=index))


class _Regather:
    """A gathered tensor autograd saved as this rank's slice: gathered again in the backward,
    once for all the nodes that saved it (q, k and v read one gathered input)."""

    def __init__(self, local: torch.Tensor, state: SequenceParallel) -> None:
        self.local, self.group, self.dim, self.uses, self.full = local, state.group, state.dim_of(local), 0, None

    def prefetch(self) -> None:
        """Start gathering now, to overlap with the backward that runs before :meth:`get`
        (``enable_sequence_overlap``: the row-parallel layer after this input's region starts it)."""
        if self.full is None and self.uses > 0:
            self._start()

    def _start(self) -> None:
        self.full = start_all_gather(self.local, self.group, self.dim, where="backward: gathering a saved input")

    def get(self) -> torch.Tensor:
        if self.full is None:  # not prefetched (or a second backward through the same graph)
            self._start()
        if isinstance(self.full, Pending):
            self.full = self.full.wait()
        full, self.uses = self.full, self.uses - 1
        if self.uses <= 0:
            self.full = None  # the last node that saved it has it: nothing more to keep
        return full


def _regather_hooks(state: SequenceParallel):
    """``saved_tensors_hooks`` that save a gathered input (Megatron's: the column-parallel layers'
    inputs) as this rank's slice: sequence parallelism then keeps 1/tp of those activations."""
    shared: dict[int, _Regather] = {}

    def pack(t: torch.Tensor):
        entry = state.gathered.get(storage_key(t))
        full = entry[0]() if entry is not None else None
        if full is None or t.numel() == 0:
            return t
        regather = shared.get(id(entry[1]))
        if regather is None or regather.local is not entry[1]:
            regather = shared[id(entry[1])] = _Regather(entry[1], state)
        regather.uses += 1
        state.latest_saved = regather
        # the saved tensor may be a view of the gathered one: its shape, strides and offset
        return regather, tuple(t.shape), t.stride(), t.storage_offset() - full.storage_offset()

    def unpack(saved):
        if not isinstance(saved, tuple):
            return saved
        regather, shape, stride, offset = saved
        full = regather.get()
        return full.as_strided(shape, stride, full.storage_offset() + offset)

    return pack, unpack


class _TokenSum(torch.autograd.Function):
    """Megatron's *f* for a block parameter under a sequence split: identity forward; backward, the
    gradient (from this rank's tokens) summed over the group. A rank none of whose tokens reached
    the parameter (an expert no token of its was routed to) still joins the sum, with zeros: the
    collectives of every rank stay in step. The gradient stays ``None`` only where no rank's tokens
    reached it, as unsharded: a flag summed with the gradient says so, read on the host only by a
    rank that had no gradient of its own (one sync, on that rare path)."""

    @staticmethod
    def forward(ctx, p, group):
        ctx.set_materialize_grads(False)
        ctx.group, ctx.shape, ctx.like = group, p.shape, (p.dtype, p.device)
        ctx.where = None if traced.compiling() else backward_of(" (a block parameter's gradient over the tokens)")
        return p.view_as(p)

    @staticmethod
    def backward(ctx, grad):
        if traced.compiling():
            grad = torch.zeros(ctx.shape, dtype=ctx.like[0], device=ctx.like[1]) if grad is None else grad
            return traced.all_reduce(grad, ctx.group), None
        if grad is None:
            flat = torch.zeros(ctx.shape.numel() + 1, dtype=ctx.like[0], device=ctx.like[1])
        else:
            flat = torch.cat([grad.reshape(-1), grad.new_ones(1)])
        all_reduce(flat, ctx.group, where=ctx.where)
        if grad is None and flat[-1].item() == 0:  # no rank's tokens reached it
            return None, None
        return flat[:-1].view(ctx.shape), None


class _Anchor(torch.autograd.Function):
    """Identity on a module's output whose backward reaches every :class:`_TokenSum` copy the module
    made on entry, used or not on this rank: each runs its backward (its all-reduce) on every rank."""

    @staticmethod
    def forward(ctx, x, *copies):
        ctx.n = len(copies)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return (grad, *([None] * ctx.n))


def _anchored(output, copies: list):
    """``output`` (a module's: a tensor or a tuple starting with one) with :class:`_Anchor` on its first
    tensor; ``None`` (left as it is) where that tensor needs no gradient or the output is of another kind,
    and the copies then run their sums as this rank's tokens reach them."""
    first = output[0] if isinstance(output, tuple) and output else output
    if not (copies and isinstance(first, torch.Tensor) and first.requires_grad):
        return None
    anchored = _Anchor.apply(first, *copies)
    return (anchored, *output[1:]) if isinstance(output, tuple) else anchored


def _token_sums(block: nn.Module, owners: list[tuple[nn.Module, list[str]]], state: SequenceParallel) -> None:
    """Make the gradients of ``owners``' parameters (``(module, names)`` inside ``block``), from this
    rank's tokens only while a split forward runs, the sum over every token: each module of the
    block that holds one of them, or whose children do, shadows them on entry
    (:func:`_sum_grads_when_split`), those of its whole subtree not shadowed yet. A parent may read a
    child's parameter without calling the child (LongCat-Flash's router runs
    ``F.linear(x, self.classifier.weight)``), or the block a child's in a method of its own (Gemma 3n's AltUp
    ``correct_output_scale``). HuggingFace checkpoints a layer's ``forward``, inside its hooks: a checkpointed
    block makes its copies inside the checkpoint instead, in the forward and in the recompute alike
    (:func:`~shardcore.tensor_parallel.recompute.carry_into_recompute`), so both run the same ops (selective
    checkpointing matches them one by one) and a reentrant checkpoint's backward, which runs the recompute's
    graph, sums them."""
    for module in block.modules():
        inside = {id(m) for m in module.modules()}
        mine = [(m, names) for m, names in owners if id(m) in inside]
        if mine:
            _sum_grads_when_split(module, mine, state, recomputed=module is block)


def _sum_grads_when_split(
    module: nn.Module, owners: list[tuple[nn.Module, list[str]]], state: SequenceParallel, recomputed: bool = False
) -> None:
    """While a split forward runs ``module``, the parameters of ``owners`` (``(module, names)`` in its
    subtree) not shadowed yet enter it through :class:`_TokenSum`, anchored to its output.

    A forward reads ``owner.<name>``; for the split forward that attribute is shadowed by the
    parameter's copy in the owner's instance ``__dict__`` (found before ``nn.Module``'s own look-up).
    The parameter registry (``owner._parameters``) is never touched: optimizers, state dicts,
    ``named_parameters()`` and hooks see the real parameters at every moment."""
    calls: list[list] = []  # the shadows each running call of ``module`` set (a module may run nested)

    def enter(mod, args):
        made = []
        if state.active and torch.is_grad_enabled():
            for owner, names in owners:
                for n in names:
                    if n not in owner.__dict__:
                        owner.__dict__[n] = _TokenSum.apply(owner._parameters[n], state.group)
                        made.append((owner, n))
        calls.append(made)

    def leave(mod, args, output):
        made = calls.pop() if calls else []
        copies = [owner.__dict__.pop(n) for owner, n in made if n in owner.__dict__]
        return _anchored(output, copies)

    def outside(mod, args):  # a checkpointed block's copies are made inside the checkpoint, in every pass
        _ = calls.append([]) if getattr(mod, "gradient_checkpointing", False) and mod.training else enter(mod, args)

    module.register_forward_pre_hook(outside if recomputed else enter)
    module.register_forward_hook(leave, always_call=True)
    if recomputed:  # the block: HuggingFace checkpoints its forward inside its hooks
        module.__dict__["_shardcore_recompute"] = (enter, leave)


def _per_rank_dropouts(blocks: list[nn.Module], suffixes, state: SequenceParallel) -> None:
    """:func:`_per_rank_when_split` on each block's dropout modules ``suffixes`` (those it has)."""
    for block in blocks:
        for suffix in suffixes:
            try:
                dropout = block.get_submodule(suffix)
            except AttributeError:
                continue
            _per_rank_when_split(dropout, state)


def _per_rank_when_split(module: nn.Module, state: SequenceParallel) -> None:
    """Dropout on split activations draws from the per-rank stream (each rank drops its own
    tokens); on a forward that is not split it stays on the shared one (replicas in step)."""
    forward = module.forward
    # beneath a shared-stream wrapper of ours (run_in_shared_rng); a model's own decorators stay
    inner = forward.__wrapped__ if getattr(forward, "shardcore_stream", False) else forward

    @functools.wraps(forward)
    def wrapped(x, *args, **kwargs):
        if not (module.training and state.active):
            return forward(x, *args, **kwargs)
        device = "cuda" if x.is_cuda else "cpu"
        if in_tp_rng(device):  # inside a per-rank module (GPT-2's attention): its stream is ours
            return inner(x, *args, **kwargs)
        with fork_tp_rng(state.group, device):
            return inner(x, *args, **kwargs)

    module.forward = wrapped


# -- all_to_all: DeepSpeed-Ulysses over the sequence-parallel group ---------------------------------
