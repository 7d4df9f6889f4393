"""Description builders for the patterns every transformer repeats, so a policy reads as a short list.

Each returns :class:`~shardcore.SubModuleReplacementDescription` entries (suffixes relative to
the module class the policy describes):

* :func:`attention`: separate q/k/v projections column parallel by heads (KV heads split or
  replicated), the output projection row parallel;
* :func:`packed_attention`: one packed ``[q; k; v]`` projection split per head, output row parallel;
* :func:`mlp`: input projection(s) column parallel, output projection row parallel;
* :func:`vocab_embedding` / :func:`vocab_head`: the vocabulary split over the group;
* :func:`experts`: a mixture-of-experts layer's experts module, split as the layout says (expert
  parallelism or tensor parallelism): the plugin names the module, the core picks the layer;
* :func:`heads_of_this_rank`: a ``param_replacement`` cutting keyword arguments that run over every
  head (ALiBi's bias, a per-head mask the model built before the blocks) to this rank's heads.

``shared_input=True`` builds the column layers with ``copy_input=False``: the policy must then
name the module that receives their common input in ``enter_tp_region`` (one backward
all-reduce for all of them instead of one each). The layer classes are parameters, so the same
builders serve ``[in, out]`` (``Conv1D``) weights with :mod:`shardcore.tensor_parallel.conv1d`.
"""

from __future__ import annotations

from .config import ShardConfig
from .policy import SubModuleReplacementDescription as Sub
from .tensor_parallel import (
    FusedLinear1D_Col,
    Linear1D_Col,
    Linear1D_Row,
    VocabParallelEmbedding1D,
    VocabParallelLMHead1D,
)

__all__ = ["attention", "experts", "heads_of_this_rank", "mlp", "packed_attention", "vocab_embedding", "vocab_head"]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def attention(
    prefix: str,
    heads: int,
    head_dim: int,
    *,
    kv_heads: int | None = None,
    names: tuple[str, str, str, str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    shared_input: bool = True,
    column: type = Linear1D_Col,
    row: type = Linear1D_Row,
) -> list[Sub]:
    """q, k, v column parallel by heads (``kv_heads`` for grouped-query attention), the output row parallel.

    Cross-attention, whose key and value read another tensor than the query, takes
    ``shared_input=False``: each projection then enters the tensor-parallel region on its own.
    """
    q, k, v, o = (_join(prefix, n) for n in names)
    q_kw = {"num_heads": heads, "head_dim": head_dim, "copy_input": not shared_input}
    kv_kw = {"num_heads": kv_heads or heads, "head_dim": head_dim, "copy_input": not shared_input}
    return [
        Sub(suffix=q, target_module=column, kwargs=q_kw),
        Sub(suffix=k, target_module=column, kwargs=kv_kw),
        Sub(suffix=v, target_module=column, kwargs=kv_kw),
        Sub(suffix=o, target_module=row, kwargs={"num_heads": heads, "head_dim": head_dim}),
    ]


def packed_attention(
    prefix: str,
    heads: int,
    head_dim: int,
    *,
    names: tuple[str, str] = ("qkv", "proj"),
    fused: type = FusedLinear1D_Col,
    row: type = Linear1D_Row,
    copy_input: bool = True,
) -> list[Sub]:
    """A packed ``[q; k; v]`` projection split per head (each rank holds its heads of q, of k, of v).
    ``copy_input=False`` when the attention module itself enters the tensor-parallel region
    (``enter_tp_region``)."""
    qkv, out = (_join(prefix, n) for n in names)
    qkv_kw = {"heads": (heads, heads, heads), "head_dim": head_dim, "copy_input": copy_input}
    return [
        Sub(suffix=qkv, target_module=fused, kwargs=qkv_kw),
        Sub(suffix=out, target_module=row, kwargs={"num_heads": heads, "head_dim": head_dim}),
    ]


def mlp(
    prefix: str,
    inputs: tuple[str, ...] = ("fc1",),
    output: str = "fc2",
    *,
    shared_input: bool = False,
    column: type = Linear1D_Col,
    row: type = Linear1D_Row,
) -> list[Sub]:
    """Input projection(s) column parallel (``gate``/``up`` read one tensor: ``shared_input=True``), output row parallel."""
    kw = {"copy_input": not shared_input}
    return [Sub(suffix=_join(prefix, n), target_module=column, kwargs=kw) for n in inputs] + [
        Sub(suffix=_join(prefix, output), target_module=row)
    ]


def vocab_embedding(suffix: str, config: ShardConfig) -> Sub:
    """A vocabulary-parallel embedding, padded to ``config.make_vocab_size_divisible_by`` x TP."""
    return Sub(
        suffix=suffix,
        target_module=VocabParallelEmbedding1D,
        kwargs={"make_vocab_size_divisible_by": config.make_vocab_size_divisible_by},
    )


def vocab_head(suffix: str, config: ShardConfig, *, gather_output: bool = True) -> Sub:
    """A vocabulary-parallel LM head: full logits gathered, or (``gather_output=False``) kept split."""
    return Sub(
        suffix=suffix,
        target_module=VocabParallelLMHead1D,
        kwargs={"gather_output": gather_output, "make_vocab_size_divisible_by": config.make_vocab_size_divisible_by},
    )


def experts(suffix: str, config: ShardConfig, layout) -> Sub:
    """The experts module at ``suffix`` (transformers 5's fused experts): over the
    ``expert_parallel_size x tensor_parallel_size`` ranks, tokens travelling to their experts
    (:class:`~shardcore.expert_parallel.experts.ExpertsEP`), when ``config`` asks for expert
    parallelism; else each tensor-parallel rank holding its share of whole experts
    (:class:`~shardcore.expert_parallel.experts.ExpertsTP`)."""
    from .expert_parallel.experts import ExpertsEP, ExpertsTP

    if config.expert_parallel_size > 1:
        return Sub(suffix=suffix, target_module=ExpertsEP, kwargs={"layout": layout})
    return Sub(suffix=suffix, target_module=ExpertsTP)


def heads_of_this_rank(suffix: str, layer: str, names: tuple[str, ...], heads: str = "num_heads"):
    """A ``param_replacement`` (``f(module)``): a forward pre-hook on the submodule at ``suffix`` that
    cuts its keyword arguments ``names`` to the heads the column-parallel ``layer`` (a suffix inside it)
    holds on this rank. The submodule's ``heads`` attribute is its per-rank head count (an
    ``attribute_replacement``). A tensor ``[batch * all heads, ...]`` (ALiBi's bias, head-major in each
    row) is cut row by row; a ``[batch, all heads, queries, keys]`` one (a per-head mask) along dim 1;
    anything else (a mask shared by every head, ``None``) is left as it is."""

    def cut(attention, args, kwargs):
        split = attention.get_submodule(layer)
        local = getattr(attention, heads)
        full, start = local * split.tp_size, local * split.tp_rank
        for name in names:
            t = kwargs.get(name)
            if t is None or (t.dim() == 4 and t.shape[1] != full):
                continue
            if t.dim() == 4:
                kwargs[name] = t.narrow(1, start, local)
            else:
                kwargs[name] = t.reshape(-1, full, *t.shape[1:]).narrow(1, start, local).reshape(-1, *t.shape[1:])
        return args, kwargs

    def install(module) -> None:
        module.get_submodule(suffix).register_forward_pre_hook(cut, with_kwargs=True)

    return install
