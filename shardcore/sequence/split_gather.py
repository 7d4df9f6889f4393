"""Megatron-LM's sequence parallelism (``sequence_parallelism_mode="split_gather"``) on the
model's own forward: see :mod:`shardcore.sequence`.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from ..distributed.collectives import Pending, start_all_gather
from ..pipeline import PipelineHole
from ..tensor_parallel.mappings import copy_to_tp, gather_from_tp, split_to_tp
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
            for module in block.modules():
                if isinstance(module, ParallelModule):
                    module.sequence = state
                partial = [
                    n
                    for n, p in module.named_parameters(recurse=False)
                    if p.requires_grad and n not in getattr(module, "shard_specs", {}) and id(p) not in summed
                ]
                if partial:
                    _sum_grads_when_split(module, partial, state)
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


def _sum_grads_when_split(module: nn.Module, names: list[str], state: SequenceParallel) -> None:
    """While a split forward runs, ``module``'s parameters ``names`` enter it through Megatron's
    *f* (identity forward, gradient all-reduced over the group): their gradients, from this
    rank's tokens only, become the sum over every token.

    The forward reads ``module.<name>``; for the split forward that attribute is shadowed by the
    parameter's *f* copy in the module's instance ``__dict__`` (found before ``nn.Module``'s own
    look-up). The parameter registry (``module._parameters``) is never touched: optimizers, state
    dicts, ``named_parameters()`` and hooks see the real parameters at every moment."""

    def enter(mod, args):
        for n in names:  # a forward that raised left its shadows: the real parameters come back first
            mod.__dict__.pop(n, None)
        if not (state.active and torch.is_grad_enabled()):
            return
        for n in names:
            mod.__dict__[n] = copy_to_tp(mod._parameters[n], state.group)

    def leave(mod, args, output):
        for n in names:
            mod.__dict__.pop(n, None)

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave, always_call=True)


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
