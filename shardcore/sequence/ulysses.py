"""DeepSpeed-Ulysses (``sequence_parallelism_mode="all_to_all"``) over the mesh's ``sp`` dim: the
sequence split exchanged for a head split around attention, and back. :func:`apply_ulysses` also
sets up ``"ring_attn"`` (:mod:`shardcore.sequence.ring`).
"""

from __future__ import annotations

import functools
import itertools

import torch
from torch import nn

from ..distributed.collectives import all_to_all_cat, group_rank, group_size
from ..tensor_parallel.mappings import gather_from_tp, split_to_tp
from ..tensor_parallel.regions import SequenceParallel
from .check import _watch_forward, mask_heads, refuse_cached_keys, stacked_dim
from .declared import regions, set_attention
from .gathered import install_gathered, install_whole_masks, sequence_dim, zigzagged
from .ring import _unzigzag, _zigzag
from .split_gather import _per_rank_dropouts, _token_sums


def apply_ulysses(model: nn.Module, policy, state: SequenceParallel) -> None:
    """DeepSpeed-Ulysses, or with ``state.mode == "ring_attn"`` context parallelism (zigzag split,
    :func:`ring_attention`), over ``state.group`` (the mesh's ``sp`` dim): the hidden states split along
    the sequence at the first block's input (and the per-block inputs that run along it, such as
    rotary ``position_embeddings``), gathered at the last block's output; around attention an
    all-to-all trades the sequence split for a head split and back, through the model library's
    attention registry (:attr:`SequenceSpec.set_attention <shardcore.spec.SequenceSpec>`). Every block parameter's
    gradient, from this rank's tokens only, is summed over the group. Each of the spec's ``regions``
    (an encoder-decoder's encoder) is split and gathered on its own; blocks outside them run whole."""
    _watch_forward(model, state)
    spec = policy.sequence()
    state.zigzag = spec.causal  # a bidirectional model's ring: contiguous parts, no balance to keep
    state.per_head = spec.per_head
    blocks = []
    for region in regions(policy):
        names, run = zip(*region, strict=True)
        hooks = _SplitHooks(state, spec, model, list(names))
        for i, block in enumerate(run):  # on a pipeline stage: the first and last block this stage holds
            block.register_forward_pre_hook(functools.partial(hooks.enter, i), with_kwargs=True)
            block.register_forward_hook(functools.partial(hooks.leave, i))
        blocks += run
        _gather_mixers(spec, region, state)
    for block in blocks:
        owners = []
        for module in block.modules():
            module.__dict__["_shardcore_sequence"] = state  # the attention function finds it here
            own = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
            if own:  # every block parameter saw this rank's tokens only
                owners.append((module, own))
        _token_sums(block, owners, state)
    _per_rank_dropouts(blocks, spec.dropouts, state)
    set_attention(policy, state)


def _gather_mixers(spec, region: list, state: SequenceParallel) -> None:
    """The spec's token mixers outside the attention (:attr:`SequenceSpec.gathered`) and the attention modules'
    own mask builders (:attr:`SequenceSpec.mask_builders`) that this region's blocks hold, run over the whole
    sequence (:mod:`shardcore.sequence.gathered`)."""
    from ..pipeline import PipelineHole

    found, masks = [], []
    for name, block in region:
        if isinstance(block, PipelineHole):  # on a pipeline stage: another stage's block
            continue
        inside = [g for g in spec.gathered if g.startswith(f"{name}.")]
        found += [(g, block.get_submodule(g[len(name) + 1 :])) for g in inside]
        builders = [b.rpartition(".") for b in spec.mask_builders if b.startswith(f"{name}.")]
        masks += [(m, block.get_submodule(m[len(name) + 1 :]), method) for m, _, method in builders]
    install_gathered(found, state, spec.split_kwargs)
    install_whole_masks(masks, state)


class _SplitHooks:
    """The hooks that split the hidden states (and ``split_kwargs``) at the first block's input and
    gather them at the last block's output; ``ring_attn`` splits in zigzag order, two chunks a rank
    (for causal balance), or a bidirectional model's in contiguous parts."""

    def __init__(self, state: SequenceParallel, spec, model: nn.Module, names: list) -> None:
        self.state, self.model, self.names = state, model, names
        self.split_kwargs, self.block_inputs = spec.split_kwargs, spec.block_inputs
        self.unmixed = frozenset(spec.unmixed)  # blocks that mix no tokens: no attention call expected of them
        self.zigzag = zigzagged(state)  # zigzag chunks, 2 a rank
        self.parts = 2 * state.size if self.zigzag else state.size
        self.blocks = 0  # the blocks run since the split (a pipeline stage runs its own)
        self.hidden_dim = state.dim  # the hidden states' sequence dimension (2 where streams are stacked before)

    def held(self, index: int) -> bool:
        """Whether block ``index`` runs here: on a pipeline stage the others are holes, and the split (the
        gather) goes with the first (the last) block the stage holds; the stages hand on whole states."""
        from ..pipeline import PipelineHole

        names = self.names
        return 0 <= index < len(names) and not isinstance(self.model.get_submodule(names[index]), PipelineHole)

    def enter(self, index: int, module, args, kwargs):
        if not self.held(index - 1):
            split = self.split_first(module, args, kwargs)
            args, kwargs = split if split is not None else (args, kwargs)
        if self.state.active and self.names[index] not in self.unmixed:
            self.blocks += 1
        return self.split_along(module, args, kwargs)

    def leave(self, index: int, module, args, output):
        return None if self.held(index + 1) else self.gather_last(module, args, output)

    def split(self, t: torch.Tensor, dim: int | None = None) -> torch.Tensor:
        state = self.state
        dim = state.dim if dim is None else dim
        return split_to_tp(_zigzag(t, state.size, dim) if self.zigzag else t, state.group, dim=dim)

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        state, dim = self.state, self.hidden_dim
        t = gather_from_tp(t, state.group, dim=dim)
        return _unzigzag(t, state.size, dim) if self.zigzag else t

    def split_first(self, module, args, kwargs):
        state = self.state
        in_kwargs = "hidden_states" in kwargs
        x = kwargs["hidden_states"] if in_kwargs else args[0]
        self.hidden_dim = stacked_dim(x, state, self.names[0], _positions(module, args, kwargs))
        length = x.shape[self.hidden_dim]
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # transformers >= 5.24 names it ``cache``
        cached = cache is not None and not module.training
        # a KV cache would keep only this rank's part of the sequence: inference with one runs unsplit
        state.active = length % self.parts == 0 and length >= self.parts and not cached
        if not state.active:
            return None
        state.attention_calls, self.blocks, state.length, state.whole = 0, 0, length, {}
        x = self.split(x, self.hidden_dim)
        return (args, {**kwargs, "hidden_states": x}) if in_kwargs else ((x, *args[1:]), kwargs)

    def split_along(self, module, args, kwargs):
        if not self.state.active:
            return args, kwargs
        out, args = dict(kwargs), list(args)
        named = _positional(module, len(args))  # Gemma 4 hands its per_layer_input by position
        for key in (*self.split_kwargs, *self.block_inputs):
            at = named.get(key)
            value = kwargs.get(key) if at is None else args[at]
            if isinstance(value, torch.Tensor):
                dim = _laid_out(value, self.state, key) if key in self.block_inputs else _along(value, self.state, key)
                value, self.state.whole[key] = self.split(value, dim), value
            elif isinstance(value, tuple) and all(isinstance(v, torch.Tensor) for v in value):
                value = tuple(self.split(v, _along(v, self.state, key)) for v in value)
            else:
                continue
            if at is None:
                out[key] = value
            else:
                args[at] = value
        return tuple(args), out

    def gather_last(self, module, args, output):
        state = self.state
        if not state.active:
            return None
        state.active = False
        if state.attention_calls < self.blocks:  # never silently attention over this rank's tokens only
            raise RuntimeError(
                f"sequence_parallelism_mode={state.mode!r}: {self.blocks} blocks ran but the split attention "
                f"ran {state.attention_calls} times; this model's attention does not go through the registry "
                "shardcore switched"
            )
        if isinstance(output, tuple):
            return (self.gather(output[0]), *output[1:])
        return self.gather(output)


@functools.cache
def _parameters(cls: type) -> tuple[str, ...]:
    import inspect

    try:
        params = list(inspect.signature(cls.forward).parameters.values())[1:]  # after self
    except (TypeError, ValueError):
        return ()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(p.name for p in itertools.takewhile(lambda p: p.kind in positional, params))  # up to *args


def _positions(module: nn.Module, args: tuple, kwargs: dict) -> int | None:
    """The sequence's length as the positions handed to a block say it (its rotary embeddings' or position ids'),
    ``None`` where it takes neither."""
    at = _positional(module, len(args))
    for key in ("position_embeddings", "position_ids"):
        value = args[at[key]] if key in at else kwargs.get(key)
        value = value[0] if isinstance(value, tuple) and value else value
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            return value.shape[-2] if key == "position_embeddings" and value.dim() >= 2 else value.shape[-1]
    return None


def _positional(module: nn.Module, count: int) -> dict[str, int]:
    """The parameter names of a block's first ``count`` positional arguments, to their positions (the
    hidden states', the first, left out)."""
    names = _parameters(type(module))
    return {names[i]: i for i in range(1, min(count, len(names)))}


def _laid_out(t: torch.Tensor, state: SequenceParallel, key: str) -> int:
    """The hidden states' dimension, along which a block's own input ``key`` runs (refused where it does not:
    a dimension elsewhere as long as the sequence may be a width that happens to be)."""
    if t.dim() > state.dim and t.shape[state.dim] == state.length:
        return state.dim
    raise NotImplementedError(  # the same on every rank, at the same block: none left waiting
        f"sequence_parallelism_mode={state.mode!r}: the blocks' {key!r} {tuple(t.shape)} does not run along the "
        f"sequence of {state.length} tokens on dim {state.dim}, as the hidden states do; leave "
        "enable_sequence_parallelism=False"
    )


def _along(t: torch.Tensor, state: SequenceParallel, key: str) -> int:
    """The dimension of ``t`` (a block's argument ``key``) that runs along the sequence
    (:func:`~shardcore.sequence.gathered.sequence_dim`); refused where there is no such one dimension."""
    dim = sequence_dim(t, state)
    if dim is None:  # the same on every rank, at the same block: none left waiting
        raise NotImplementedError(
            f"sequence_parallelism_mode={state.mode!r}: the blocks' {key!r} {tuple(t.shape)} runs along the "
            f"sequence of {state.length} tokens on no one dimension (none, or several as long); leave "
            "enable_sequence_parallelism=False"
        )
    return dim


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


class _HeadView:
    """An attention module as the attention function sees it under Ulysses: its per-head values this
    rank's slice, everything else the module's own."""

    def __init__(self, module: nn.Module, values: dict) -> None:
        self.__dict__["_shardcore_of"], self.__dict__["_shardcore_values"] = module, values

    def __getattr__(self, name: str):
        values = self.__dict__["_shardcore_values"]
        return values[name] if name in values else getattr(self.__dict__["_shardcore_of"], name)


def _heads_of(module: nn.Module, kwargs: dict, names: tuple[str, ...], group) -> tuple:
    """``module`` and the attention function's ``kwargs`` with each per-head value in ``names`` (one
    per query head: attention sinks) cut to this rank's heads; the gradient of a cut parameter reaches
    its slice only, and the sum over the group makes it whole."""
    size, rank = group_size(group), group_rank(group)

    def cut(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(size)[rank]

    kwargs = {k: cut(v) if k in names and isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    own = {n: cut(getattr(module, n)) for n in names if isinstance(getattr(module, n, None), torch.Tensor)}
    return (_HeadView(module, own) if own else module), kwargs


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
        refuse_cached_keys(module, query, key, state)
        state.attention_calls += 1
        query, key, value = (_AllToAll.apply(t, group, 1, 2) for t in (query, key, value))
        kwargs = {k: state.whole.get(k, v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4 and attention_mask.shape[1] > 1:
            attention_mask = mask_heads(attention_mask, query.shape[1] * state.size, key.shape[1] * state.size, state)
        if state.per_head:
            module, kwargs = _heads_of(module, kwargs, state.per_head, group)
        out, _ = base(module, query, key, value, attention_mask, **kwargs)
        return _AllToAll.apply(out, group, 1, 2), None  # (batch, seq, heads, dim): seq split, heads whole

    return attention
