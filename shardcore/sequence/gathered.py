"""Token mixers outside the attention under Ulysses and the ring: a linear attention, a state-space
mixer, a short convolution (:attr:`SequenceSpec.gathered <shardcore.spec.SequenceSpec>`).

Such a module mixes every earlier token into each position by its own arithmetic (a recurrence or a
convolution), not through the attention registry a sequence split switches: on a rank's part of the
sequence it would compute something else. So it runs over the whole sequence: its input (and what
runs along the sequence beside it) is all-gathered over the group, the module runs as it is, and its
output is cut back to this rank's part. The backward of the gather is a reduce-scatter: each rank's
gradient for the whole input comes from its own part of the output, and the sum over the group is
the gradient of the unsharded model. The module's parameters see this rank's part of the output
only; their gradients are summed over the group as every block parameter's are.

The cost is the module's work and activations over the whole sequence on every rank of the group
(the attention layers beside it still split theirs), and one all-gather and one reduce-scatter of
the hidden states a module.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from ..distributed.collectives import group_rank
from ..tensor_parallel.regions import SequenceParallel, gather_seq
from .ring import _unzigzag, _zigzag


def install_gathered(modules: list[tuple[str, nn.Module]], state: SequenceParallel, along: tuple[str, ...]) -> None:
    """Run each ``(name, module)`` over the whole sequence while the forward is split: ``along`` are the
    keyword arguments that run along the sequence with the hidden states (gathered with them)."""
    for name, module in modules:
        module.register_forward_pre_hook(functools.partial(_enter, state, along, name), with_kwargs=True)
        module.register_forward_hook(functools.partial(_leave, state, name))


def install_whole_masks(methods: list[tuple[str, nn.Module, str]], state: SequenceParallel) -> None:
    """Run each ``(name, module, method)``, an attention module's own mask builder
    (:attr:`SequenceSpec.mask_builders <shardcore.spec.SequenceSpec>`), over the whole sequence while the
    forward is split: set on the module itself (its class untouched), it goes with the model."""
    import inspect

    for name, module, method in methods:
        bound = getattr(module, method)
        how = (inspect.signature(bound), _read_for_shape(type(module), method))  # read once, not every forward
        module.__dict__[method] = functools.partial(_whole_mask, state, f"{name}.{method}", bound, how)


@functools.cache
def _read_for_shape(cls: type, method: str) -> frozenset[str]:
    """The parameters of ``cls.method`` it reads only for their shape, dtype or device (Doge's mask builder reads
    its hidden states' length and dtype): handed a view as long as the whole sequence, not gathered. Read from
    the source; none where it cannot be read."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(cls, method))))
    except (OSError, TypeError, SyntaxError):
        return frozenset()
    fn = tree.body[0]
    names = {a.arg for a in (*fn.args.args, *fn.args.kwonlyargs)}
    parents = {child: node for node in ast.walk(fn) for child in ast.iter_child_nodes(node)}
    uses: dict[str, list[bool]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id in names:
            up = parents.get(node)
            read = isinstance(up, ast.Attribute) and up.attr in ("shape", "dtype", "device", "ndim")
            uses.setdefault(node.id, []).append(read)
    return frozenset(n for n, read in uses.items() if all(read))


def _whole_mask(state: SequenceParallel, name: str, bound, how: tuple, *args, **kwargs):
    """The mask ``bound`` builds over the whole sequence: each tensor argument with one dimension (after the
    batch's) as long as the rank's part of the sequence all-gathered along it (the backward reduce-scatters), or
    one it reads only for its shape viewed at the whole length; the model's mask (already whole) and the rest as
    they are. ``how``: ``bound``'s signature and the parameters it reads for their shape (:func:`_read_for_shape`)."""
    if not state.active:
        return bound(*args, **kwargs)
    signature, shaped = how
    local = state.length // state.size

    def whole(key, t):
        if isinstance(t, tuple):  # (cos, sin)
            return tuple(whole(key, v) for v in t)
        dims = [d for d in range(1, t.dim()) if t.shape[d] == local] if isinstance(t, torch.Tensor) else []
        if len(dims) > 1:  # the same shapes on every rank: raised on all of them, before the gather
            raise RuntimeError(
                f"sequence_parallelism_mode={state.mode!r}: {name} takes {tuple(t.shape)}, with more than one "
                f"dimension as long as this rank's {local} tokens; leave enable_sequence_parallelism=False"
            )
        if not dims:
            return t
        if key in shaped:  # its length and dtype alone: no gather
            return t.narrow(dims[0], 0, 1).expand(*(state.length if d == dims[0] else -1 for d in range(t.dim())))
        return _whole(t, state, dims[0])

    given = signature.bind(*args, **kwargs)
    given.arguments.update({k: whole(k, v) for k, v in given.arguments.items()})
    mask = bound(*given.args, **given.kwargs)
    if not (isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[-2:] == (state.length,) * 2):
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise RuntimeError(
            f"sequence_parallelism_mode={state.mode!r}: {name} ran over the whole sequence of {state.length} "
            f"tokens but returned {shape}, not a (batch, heads, queries, keys) mask over it; leave "
            "enable_sequence_parallelism=False"
        )
    return mask


def zigzagged(state: SequenceParallel) -> bool:
    """Whether the split is in zigzag order: the causal ring's (and ``all_gather_kv``'s), two chunks a rank."""
    return state.mode in ("ring_attn", "all_gather_kv") and state.zigzag


def _whole(t: torch.Tensor, state: SequenceParallel, dim: int) -> torch.Tensor:
    full = gather_seq(t, state.group, dim)
    return _unzigzag(full, state.size, dim) if zigzagged(state) else full


def _part(t: torch.Tensor, state: SequenceParallel, dim: int) -> torch.Tensor:
    t = _zigzag(t, state.size, dim) if zigzagged(state) else t
    return t.chunk(state.size, dim=dim)[group_rank(state.group)]


def _local(t, state: SequenceParallel) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() > state.dim and t.shape[state.dim] * state.size == state.length


def sequence_dim(t, state: SequenceParallel) -> int | None:
    """The dimension of ``t`` that runs along the whole sequence: the hidden states' own, or the one other
    (not the batch's) as long as it (a per-position scale's ``(batch, 1, sequence, 1)``, a key projection's
    ``(batch, heads, sequence, dim)``); ``None`` when there is no such one dimension."""
    if not isinstance(t, torch.Tensor):
        return None
    if t.dim() > state.dim and t.shape[state.dim] == state.length:
        return state.dim
    dims = [d for d in range(1, t.dim()) if t.shape[d] == state.length]
    return dims[0] if len(dims) == 1 else None


def _enter(state: SequenceParallel, along: tuple[str, ...], name: str, module, args, kwargs):
    if not state.active:
        return None
    key = "hidden_states" if "hidden_states" in kwargs else None
    x = kwargs[key] if key else (args[0] if args else None)
    if not _local(x, state):  # the same shapes on every rank: raised on all of them, before the gather
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise RuntimeError(
            f"sequence_parallelism_mode={state.mode!r}: {name} ({type(module).__name__}) mixes tokens and runs "
            f"over the whole sequence, but its input {shape} is not this rank's part of {state.length} tokens "
            f"along dim {state.dim}; leave enable_sequence_parallelism=False"
        )
    state.attention_calls += 1  # a block's token mixing ran, over the whole sequence
    dim = state.dim
    kwargs = dict(kwargs)
    for k in along:  # what runs along the sequence beside the hidden states (the rotary embeddings)
        value = kwargs.get(k)
        if _local(value, state):
            kwargs[k] = _whole(value, state, dim)
        elif isinstance(value, tuple) and value and all(_local(v, state) for v in value):
            kwargs[k] = tuple(_whole(v, state, dim) for v in value)
    x = _whole(x, state, dim)
    if key:
        return args, {**kwargs, key: x}
    return (x, *args[1:]), kwargs


def _leave(state: SequenceParallel, name: str, module, args, output):
    if not state.active:
        return None
    y = output[0] if isinstance(output, tuple) else output
    dim = sequence_dim(y, state)
    if dim is None:
        shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise RuntimeError(
            f"sequence_parallelism_mode={state.mode!r}: {name} ({type(module).__name__}) ran over the whole "
            f"sequence of {state.length} tokens but returned {shape}; its output cannot be cut back to this "
            "rank's part; leave enable_sequence_parallelism=False"
        )
    y = _part(y, state, dim)
    return (y, *output[1:]) if isinstance(output, tuple) else y
