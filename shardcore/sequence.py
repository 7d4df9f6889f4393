"""Sequence parallelism over the tensor-parallel group (``sequence_parallelism_mode="split_gather"``,
Megatron-LM's sequence parallelism), on the model's own forward.

Between the tensor-parallel regions (norms, residual adds, dropout) every rank holds only its
slice of the sequence: the hidden states are split along the sequence at the input of the first
of :meth:`shardcore.Policy.blocks` and gathered at the output of the last, so the model's
forward computes masks and positions on the whole sequence before the blocks and everything
after them (final norm, head, pooler) sees the whole sequence, as unsharded. Inside the blocks:

* a column-parallel layer (or an ``enter_tp_region`` module) all-gathers its input along the
  sequence instead of taking it as it is (Megatron's *f*: identity forward, all-reduce backward),
  and the backward reduce-scatters the input gradient instead of all-reducing it;
* a row-parallel layer reduce-scatters its partial sums along the sequence instead of
  all-reducing them (Megatron's *g*), the backward all-gathers.

Same communication volume as tensor parallelism alone (an all-reduce is a reduce-scatter and an
all-gather), but the activations outside the regions take 1/tp of the memory.

Replicated parameters used on sequence-split activations (norm weights, a row-parallel layer's
bias) get gradients from this rank's tokens only: they are summed over the group (the
parameter enters the forward through Megatron's *f*). Dropout on split activations (the policy's
:attr:`~shardcore.Policy.sequence_parallel_dropouts`) draws from the per-rank random stream:
each rank drops its own tokens.

A forward whose sequence length the group does not divide (a decoding step of ``generate()``, one
token) runs without the split: plain tensor parallelism, the same numbers.

``"all_to_all"`` (DeepSpeed-Ulysses) and ``"ring_attn"`` (context parallelism) run over the
mesh's ``sp`` dim instead (:func:`apply_ulysses`): the same split of the hidden states, every
rank holding the whole model (or its TP slice); around attention Ulysses exchanges the sequence
split for a head split and back, while ``ring_attn`` keeps the heads and lets each rank's queries
(two zigzag chunks, for causal balance) attend to all-gathered keys and values.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch import nn

from .layers.comm import (
    Pending,
    SequenceParallel,
    _GatherSeq,
    _storage_key,
    all_to_all_cat,
    copy_to_tp,
    gather_from_tp,
    split_to_tp,
    start_all_gather,
)
from .layers.parallel_module import ParallelModule
from .layers.rng import fork_tp_rng, in_tp_rng
from .pipeline import PipelineHole

__all__ = [
    "SequenceParallel",
    "apply_sequence_parallel",
    "apply_ulysses",
    "check_sequence_parallel",
    "ring_attention",
    "ulysses_attention",
    "zigzag_positions",
]

_BUILT = ("split_gather", "all_to_all", "ring_attn")


def check_sequence_parallel(model: nn.Module, policy, config, layout) -> str | None:
    """The mode ``config`` asks for, checked before any collective (the same on every rank)."""
    if not config.enable_sequence_parallelism:  # (overlap or a mode without it: refused by ShardConfig)
        if layout.sp > 1:
            raise ValueError(
                f"sequence_parallel_size={layout.sp} without sequence parallelism: give "
                "enable_sequence_parallelism=True, sequence_parallelism_mode='all_to_all', or leave it 1"
            )
        return None
    mode = config.sequence_parallelism_mode or "split_gather"
    if config.enable_sequence_overlap and mode != "split_gather":
        raise NotImplementedError(
            f"ShardConfig(enable_sequence_overlap=True) overlaps the collectives of "
            f"sequence_parallelism_mode='split_gather'; with {mode!r} leave it False"
        )
    supported = tuple(policy.sequence_parallelism_modes)
    if mode not in supported:
        raise NotImplementedError(
            f"{type(model).__name__}: {type(policy).__name__} does not support sequence_parallelism_mode={mode!r}"
            + (f" (it supports {', '.join(supported)})" if supported else " (no sequence parallelism)")
            + "; leave enable_sequence_parallelism=False"
        )
    if mode == "split_gather" and not policy.sequence_parallel_regions():
        raise NotImplementedError(
            f"{type(model).__name__}: {type(policy).__name__} names no blocks to split the sequence over; leave "
            "enable_sequence_parallelism=False"
        )
    if mode == "split_gather" and layout.sp > 1:
        raise ValueError(
            f"sequence_parallel_size={layout.sp} is the group of sequence_parallelism_mode='all_to_all' (or "
            "'ring_attn'); 'split_gather' splits over the tensor-parallel group: leave sequence_parallel_size=1"
        )
    if mode == "split_gather" and (layout.tp == 1 or not config.enable_tensor_parallelism):
        raise ValueError(
            "sequence_parallelism_mode='split_gather' splits the sequence over the tensor-parallel group, "
            "but tensor_parallel_size is 1; give tensor_parallel_size > 1"
        )
    if mode in ("all_to_all", "ring_attn"):
        if layout.sp == 1:
            raise ValueError(
                f"sequence_parallelism_mode={mode!r} runs over sequence_parallel_size ranks, but it is 1; give "
                "sequence_parallel_size > 1"
            )
        problem = policy.sequence_attention_problem(mode)
        if problem:
            raise NotImplementedError(f"{type(model).__name__}: {problem}")
    if mode == "all_to_all":
        tp = layout.tp if config.enable_tensor_parallelism else 1
        for what, heads in zip(("attention heads", "key/value heads"), policy.sequence_parallel_heads(), strict=True):
            if heads % (tp * layout.sp):
                raise ValueError(
                    f"{type(model).__name__}: {heads} {what} do not split over tensor_parallel_size x "
                    f"sequence_parallel_size = {tp} x {layout.sp} (Ulysses gives each rank whole heads); choose "
                    f"sizes whose product divides {heads}"
                )
    refused = {
        f"pipeline_parallel_size > 1 (sequence_parallelism_mode={mode!r}; 'split_gather' composes)": layout.pp > 1
        and mode != "split_gather",
        f"data_parallel={config.data_parallel!r}": config.data_parallel is not None,
        "enable_jit_fused (compiled modules)": config.enable_jit_fused or config.enable_all_optimization,
        "inference_only": config.inference_only,
    }
    for what, present in refused.items():
        if present:
            raise NotImplementedError(f"sequence parallelism together with {what} is not built yet; use one of them")
    return mode


def _refuse_unsupported(model: nn.Module) -> None:
    """At each forward, before any collective: what the sequence split cannot honour yet."""
    name = type(model).__name__

    def refuse(module, args, kwargs):
        cfg = getattr(module, "config", None)
        if kwargs.get("output_hidden_states") or getattr(cfg, "output_hidden_states", False):
            raise NotImplementedError(
                f"{name} with sequence parallelism: output_hidden_states would return each rank's slice of "
                "the inner layers' states; leave it off"
            )
        new_name = "is_activation_checkpointing"  # transformers 5 (is_gradient_checkpointing: 4.x, deprecated)
        checkpointing = getattr(
            module, new_name if hasattr(type(module), new_name) else "is_gradient_checkpointing", False
        )
        if module.training and checkpointing:
            raise NotImplementedError(
                f"{name}: gradient checkpointing with sequence parallelism is not built yet (the recomputed "
                "blocks would run unsplit); disable one of them"
            )

    model.register_forward_pre_hook(refuse, with_kwargs=True)


def apply_sequence_parallel(model: nn.Module, policy, state: SequenceParallel) -> None:
    """Split at the first block's input, gather at the last block's output (for each of
    :meth:`~shardcore.Policy.sequence_parallel_regions`), and make the blocks' parallel layers,
    replicated parameters and dropouts follow ``state``. Called by :func:`shardcore.optimize`
    after the sharder (which gave the layers ``state``)."""
    _refuse_unsupported(model)
    saving_now: list = []  # the saved-tensor hooks of the split running now
    for region in policy.sequence_parallel_regions():
        names, blocks = [name for name, _ in region], [block for _, block in region]
        _split_region(model, names, blocks, state, saving_now)
        for block in blocks:
            for module in block.modules():
                if isinstance(module, ParallelModule):
                    module.sequence = state
                partial = [
                    n
                    for n, p in module.named_parameters(recurse=False)
                    if p.requires_grad and n not in getattr(module, "shard_specs", {})
                ]
                if partial:
                    _sum_grads_when_split(module, partial, state)
        _per_rank_dropouts(blocks, policy.sequence_parallel_dropouts, state)


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
        length = x.shape[state.dim]
        state.active = length % state.size == 0 and length >= state.size
        if not state.active:
            return None  # plain tensor parallelism for this forward (a decoding step, an odd length)
        x = split_to_tp(x, group, dim=state.dim)
        state.gathered.clear()
        state.latest_saved = None
        if torch.is_grad_enabled():  # autograd keeps the slices of gathered inputs, not the gathered tensors
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
        self.local, self.group, self.dim, self.uses, self.full = local, state.group, state.dim, 0, None

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
        entry = state.gathered.get(_storage_key(t))
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
    rank's tokens only, become the sum over every token."""

    def enter(mod, args):
        if not (state.active and torch.is_grad_enabled()):
            return
        saved = mod.__dict__.pop("_shardcore_sp_saved", None)
        if saved:  # a forward that raised never restored them
            mod._parameters.update(saved)
        saved = {n: mod._parameters[n] for n in names}
        for n, p in saved.items():
            mod._parameters[n] = copy_to_tp(p, state.group)
        mod.__dict__["_shardcore_sp_saved"] = saved

    def leave(mod, args, output):
        saved = mod.__dict__.pop("_shardcore_sp_saved", None)
        if saved:
            mod._parameters.update(saved)

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


def apply_ulysses(model: nn.Module, policy, state: SequenceParallel) -> None:
    """DeepSpeed-Ulysses, or with ``state.mode == "ring_attn"`` context parallelism (zigzag split,
    :func:`ring_attention`), over ``state.group`` (the mesh's ``sp`` dim): the hidden states split along
    the sequence at the first block's input (and the per-block inputs that run along it, such as
    rotary ``position_embeddings``), gathered at the last block's output; around attention an
    all-to-all trades the sequence split for a head split and back, through the model library's
    attention registry (:meth:`shardcore.Policy.set_sequence_attention`). Every block parameter's
    gradient, from this rank's tokens only, is summed over the group."""
    blocks = [block for _, block in policy.blocks()]
    group = state.group
    split_kwargs = tuple(policy.sequence_split_kwargs)
    _refuse_unsupported(model)

    ring = state.mode == "ring_attn"
    parts = 2 * state.size if ring else state.size  # ring: two chunks a rank (zigzag, for causal balance)

    def split(t: torch.Tensor) -> torch.Tensor:
        return split_to_tp(_zigzag(t, state.size, state.dim) if ring else t, group, dim=state.dim)

    def gather(t: torch.Tensor) -> torch.Tensor:
        t = gather_from_tp(t, group, dim=state.dim)
        return _unzigzag(t, state.size, state.dim) if ring else t

    def split_first(module, args, kwargs):
        in_kwargs = "hidden_states" in kwargs
        x = kwargs["hidden_states"] if in_kwargs else args[0]
        length = x.shape[state.dim]
        cached = kwargs.get("past_key_values") is not None and not module.training
        # a KV cache would keep only this rank's part of the sequence: inference with one runs unsplit
        state.active = length % parts == 0 and length >= parts and not cached
        if not state.active:
            return None
        state.attention_calls = 0
        x = split(x)
        return (args, {**kwargs, "hidden_states": x}) if in_kwargs else ((x, *args[1:]), kwargs)

    def split_along(module, args, kwargs):
        if not state.active:
            return None
        out = dict(kwargs)
        for key in split_kwargs:
            value = kwargs.get(key)
            if isinstance(value, torch.Tensor):
                out[key] = split(value)
            elif isinstance(value, tuple) and all(isinstance(v, torch.Tensor) for v in value):
                out[key] = tuple(split(v) for v in value)
        return args, out

    def gather_last(module, args, output):
        if not state.active:
            return None
        state.active = False
        if state.attention_calls < len(blocks):  # never silently attention over this rank's tokens only
            raise RuntimeError(
                f"sequence_parallelism_mode={state.mode!r}: {len(blocks)} blocks ran but the split attention "
                f"ran {state.attention_calls} times; this model's attention does not go through the registry "
                "shardcore switched"
            )
        if isinstance(output, tuple):
            return (gather(output[0]), *output[1:])
        return gather(output)

    blocks[0].register_forward_pre_hook(split_first, with_kwargs=True)
    for block in blocks:  # after split_first on the first block: the flag is set when these run
        block.register_forward_pre_hook(split_along, with_kwargs=True)
    blocks[-1].register_forward_hook(gather_last)
    for block in blocks:
        for module in block.modules():
            module.__dict__["_shardcore_sequence"] = state  # the attention function finds it here
            own = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
            if own:  # every block parameter saw this rank's tokens only
                _sum_grads_when_split(module, own, state)
    _per_rank_dropouts(blocks, policy.sequence_parallel_dropouts, state)
    policy.set_sequence_attention(state)


def _zigzag(t: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    """The sequence's ``2 * size`` chunks reordered so that rank ``r``'s equal part is chunks ``r``
    and ``2 * size - 1 - r``: under a causal mask every rank then has the same work."""
    chunks = t.chunk(2 * size, dim=dim)
    return torch.cat([c for r in range(size) for c in (chunks[r], chunks[2 * size - 1 - r])], dim=dim)


def _unzigzag(t: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    """The inverse of :func:`_zigzag`."""
    chunks = t.chunk(2 * size, dim=dim)
    order = [None] * (2 * size)
    for r in range(size):
        order[r], order[2 * size - 1 - r] = chunks[2 * r], chunks[2 * r + 1]
    return torch.cat(order, dim=dim)


def zigzag_positions(length: int, size: int) -> torch.Tensor:
    """The global position of each token in the zigzag order (rank ``r``'s part is the ``r``-th of
    ``size`` equal slices of the result)."""
    return _zigzag(torch.arange(length), size, 0)


def ring_attention(base):
    """An attention function for a registry that runs ``base`` under ``ring_attn`` context
    parallelism: this rank's queries (two zigzag chunks of the sequence) attend to every key and
    value, all-gathered along the sequence (backward: their gradients reduce-scattered), with the
    model's mask taken at the queries' and keys' global positions (causal and padding)."""

    @functools.wraps(base)
    def attention(module, query, key, value, attention_mask, **kwargs):
        state = module.__dict__.get("_shardcore_sequence")
        if state is None or not state.active:
            return base(module, query, key, value, attention_mask, **kwargs)
        state.attention_calls += 1
        group, rank = state.group, dist.get_group_rank(state.group, dist.get_rank())
        key, value = (_GatherSeq.apply(t, group, 2) for t in (key, value))  # zigzag order, every rank's keys
        local = query.shape[2]
        positions = zigzag_positions(local * state.size, state.size).to(query.device)
        mine = positions[rank * local : (rank + 1) * local]
        if attention_mask is None and getattr(module, "is_causal", True):  # causal, at global positions
            attention_mask = positions[None, None, None, :] <= mine[None, None, :, None]
        elif attention_mask is not None:  # (None on a bidirectional model: every key, no mask)
            attention_mask = attention_mask[:, :, mine][:, :, :, positions]
        return base(module, query, key, value, attention_mask, **kwargs)

    return attention


class _AllToAll(torch.autograd.Function):
    """Split ``x`` along ``scatter`` into the group's ranks and concatenate what they send along
    ``gather``; the backward is the inverse exchange."""

    @staticmethod
    def forward(ctx, x, group, scatter: int, gather: int):
        ctx.group, ctx.scatter, ctx.gather = group, scatter, gather
        return all_to_all_cat(x, group, scatter, gather)

    @staticmethod
    def backward(ctx, grad):
        return (
            all_to_all_cat(grad, ctx.group, ctx.gather, ctx.scatter, where="backward of Ulysses attention"),
            None,
            None,
            None,
        )


def ulysses_attention(base):
    """An attention function for a registry (HuggingFace's ``AttentionInterface``) that runs
    ``base`` under Ulysses: ``(batch, heads, seq/sp, dim)`` query, key and value exchanged to
    ``(batch, heads/sp, seq, dim)``, attention over the whole sequence, the output ``(batch,
    seq, heads/sp, dim)`` exchanged back to ``(batch, seq/sp, heads, dim)``."""

    @functools.wraps(base)
    def attention(module, query, key, value, attention_mask, **kwargs):
        state = module.__dict__.get("_shardcore_sequence")
        if state is None or not state.active:
            return base(module, query, key, value, attention_mask, **kwargs)
        group = state.group
        state.attention_calls += 1
        query, key, value = (_AllToAll.apply(t, group, 1, 2) for t in (query, key, value))
        out, _ = base(module, query, key, value, attention_mask, **kwargs)
        return _AllToAll.apply(out, group, 1, 2), None  # (batch, seq, heads, dim): seq split, heads whole

    return attention
