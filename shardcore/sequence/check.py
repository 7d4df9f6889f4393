"""What sequence parallelism a configuration asks for, checked before any collective."""

from __future__ import annotations

from torch import nn

from ..attach import attached
from ..tensor_parallel.recompute import checkpointing
from .declared import attention_problem, heads_of, regions

_BUILT = ("split_gather", "all_to_all", "ring_attn", "all_gather_kv")


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
    spec = policy.sequence()
    supported = tuple(spec.modes)
    if "ring_attn" in supported:  # the same split and registry, the keys and values gathered
        supported += ("all_gather_kv",)
    if mode not in supported:
        why = spec.refused.get("ring_attn" if mode == "all_gather_kv" else mode)  # the policy's reason, if given
        said = (
            f"sequence_parallelism_mode={mode!r} is refused: {why}"
            if why
            else (
                f"{type(policy).__name__} does not support sequence_parallelism_mode={mode!r}"
                + (f" (it supports {', '.join(supported)})" if supported else " (no sequence parallelism)")
            )
        )
        raise NotImplementedError(f"{type(model).__name__}: {said}; leave enable_sequence_parallelism=False")
    if mode == "split_gather":
        _check_split_gather(model, policy, config, layout)
    else:
        _check_over_sp(model, policy, config, layout, mode)
    _refuse_combinations(config, layout, mode)
    return mode


def _check_split_gather(model: nn.Module, policy, config, layout) -> None:
    if not regions(policy):
        raise NotImplementedError(
            f"{type(model).__name__}: {type(policy).__name__} names no blocks to split the sequence over; leave "
            "enable_sequence_parallelism=False"
        )
    if layout.sp > 1:
        raise ValueError(
            f"sequence_parallel_size={layout.sp} is the group of sequence_parallelism_mode='all_to_all' (or "
            "'ring_attn'); 'split_gather' splits over the tensor-parallel group: leave sequence_parallel_size=1"
        )
    if layout.tp == 1 or not config.enable_tensor_parallelism:
        raise ValueError(
            "sequence_parallelism_mode='split_gather' splits the sequence over the tensor-parallel group, "
            "but tensor_parallel_size is 1; give tensor_parallel_size > 1"
        )
    ask = policy.sequence().attention_problem  # a policy's own word on its region (the registry has none)
    problem = ask("split_gather") if ask is not None else None
    if problem:
        raise NotImplementedError(f"{type(model).__name__}: {problem}")


def _check_over_sp(model: nn.Module, policy, config, layout, mode: str) -> None:
    """``all_to_all``, ``ring_attn`` and ``all_gather_kv``: over the mesh's sp dim, through the
    attention registry."""
    if layout.sp == 1:
        raise ValueError(
            f"sequence_parallelism_mode={mode!r} runs over sequence_parallel_size ranks, but it is 1; give "
            "sequence_parallel_size > 1"
        )
    if not regions(policy):
        raise NotImplementedError(
            f"{type(model).__name__}: {type(policy).__name__} names no blocks to split the sequence over; leave "
            "enable_sequence_parallelism=False"
        )
    problem = attention_problem(policy, "ring_attn" if mode == "all_gather_kv" else mode)
    if problem:
        raise NotImplementedError(f"{type(model).__name__}: {problem}")
    if mode != "all_to_all":
        return
    tp = layout.tp if config.enable_tensor_parallelism else 1
    for what, heads in zip(("attention heads", "key/value heads"), heads_of(policy), strict=True):
        if heads % (tp * layout.sp):
            raise ValueError(
                f"{type(model).__name__}: {heads} {what} do not split over tensor_parallel_size x "
                f"sequence_parallel_size = {tp} x {layout.sp} (Ulysses gives each rank whole heads); choose "
                f"sizes whose product divides {heads}"
            )


def _refuse_combinations(config, layout, mode: str) -> None:
    refused = {
        "enable_jit_fused (compiled modules)": config.enable_jit_fused or config.enable_all_optimization,
        "inference_only": config.inference_only,
    }
    for what, present in refused.items():
        if present:
            raise NotImplementedError(f"sequence parallelism together with {what} is not built yet; use one of them")


def refuse_stacked(x, state, block: str) -> None:
    """At the split, before its first collective (every rank alike): hidden states entering ``block``
    that are not ``(batch, sequence, hidden)`` (several streams stacked before the sequence, Gemma 3n's)
    are refused, not cut along another dimension."""
    if x.dim() != 3:
        raise NotImplementedError(
            f"sequence_parallelism_mode={state.mode!r}: the hidden states entering {block} have shape "
            f"{tuple(x.shape)}, not (batch, sequence, hidden) (several streams stacked?): the split along dim "
            f"{state.dim} would not cut the sequence; leave enable_sequence_parallelism=False"
        )


def stacked_dim(x, state, block: str, length: int | None) -> int:
    """At the split, before its first collective (every rank alike): the dimension of the hidden states entering
    ``block`` that runs along the sequence. ``(batch, sequence, hidden)``'s own; where several streams are stacked
    before the sequence (Gemma 3n's ``(streams, batch, sequence, hidden)``), the one dimension before the hidden
    one as long as the positions handed to the block say the sequence is (``length``); refused otherwise."""
    if x.dim() == 3:
        return state.dim
    dims = [d for d in range(x.dim() - 1) if length is not None and x.shape[d] == length]
    if x.dim() == 4 and dims == [2]:
        return 2
    refuse_stacked(x, state, block)
    return state.dim


def refuse_cached_keys(module, query, key, state) -> None:
    """In the attention of a split forward, before its collectives (every rank alike): keys longer than
    this rank's queries are keys of earlier tokens read from a KV cache (a layer run twice in one forward
    with the cache transformers makes in training, its second run reading the first's), which the split
    left a rank's part of. Refused, not attended to."""
    if key.shape[2] != query.shape[2]:
        raise NotImplementedError(
            f"sequence_parallelism_mode={state.mode!r}: {type(module).__name__} attends {query.shape[2]} queries "
            f"of this rank to {key.shape[2]} keys: keys read from a KV cache inside a split forward (a layer run "
            "twice with the cache, its second run reading the first's), a rank's part of them; call the model "
            "with use_cache=False"
        )


def _watch_forward(model: nn.Module, state) -> None:
    """At each forward, before any collective: refuse what the sequence split cannot honour yet,
    and note whether the blocks will be recomputed (activation checkpointing: what the recompute
    needs is carried into it, see :mod:`shardcore.tensor_parallel.recompute`)."""
    name = type(model).__name__

    def watch(module, args, kwargs):
        cfg = getattr(module, "config", None)
        if kwargs.get("output_hidden_states") or getattr(cfg, "output_hidden_states", False):
            raise NotImplementedError(
                f"{name} with sequence parallelism: output_hidden_states would return each rank's slice of "
                "the inner layers' states; leave it off"
            )
        state.checkpointing = checkpointing(module)

    attached(model).before_forward(
        model, "watch_sequence", watch, with_kwargs=True, what="what the sequence split cannot honour, refused"
    )


def mask_heads(mask, query_heads: int, kv_heads: int, state):
    """A mask with one slice a head (Doge's dynamic mask) cut to this rank's heads under Ulysses; refused where
    its head count is neither the queries' nor the keys' (the same on every rank: their shapes are alike)."""
    from ..distributed.collectives import group_rank, group_size

    if mask.shape[1] not in (query_heads, kv_heads):
        raise NotImplementedError(
            f"sequence_parallelism_mode={state.mode!r}: the attention mask {tuple(mask.shape)} has {mask.shape[1]} "
            f"slices along dim 1, neither the {query_heads} query heads nor the {kv_heads} key/value heads the split "
            "cuts; leave enable_sequence_parallelism=False"
        )
    return mask.chunk(group_size(state.group), dim=1)[group_rank(state.group)]  # the heads divide by sp (optimize)
