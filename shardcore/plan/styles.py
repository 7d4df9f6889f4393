"""transformers' tensor-parallel styles, each with the meaning transformers gives it, in shardcore's layers.

A style names what happens to a module (or to one parameter) and to the activations around it.
transformers applies them with DTensor hooks (``transformers.distributed.tensor_parallel``);
shardcore gives each the same numbers with its own parallel layers and collectives:

==========================  ==========================================================================
style                       in shardcore
==========================  ==========================================================================
``colwise``                 ``nn.Linear`` -> :class:`Linear1D_Col` (by heads where the parent has
                            ``head_dim``); a bare parameter (fused experts ``[E, out, in]``, a
                            per-head vector) cut along dim ``ndim - 2`` (dim 0 when 1-D)
``rowwise``                 ``nn.Linear`` -> :class:`Linear1D_Row`; a bare parameter cut along its
                            last dim (a bias stays whole)
``colwise_gather_output``   :class:`Linear1D_Col` with its output all-gathered (``colwise_rep`` too)
``rowwise_split_input``     :class:`Linear1D_Row` keeping its slice of a whole input (``rowwise_rep``)
``packed_colwise``          :class:`Linear1D_Col` over ``[gate; up]``, each part split on its own;
                            a bare parameter: its packed dim ``ndim - 2`` split the same way
``packed_rowwise``          a bare parameter whose last dim packs two parts, each split on its own
``embedding_rowwise``       :class:`VocabParallelEmbedding1D` (the vocabulary split)
``embedding_colwise``       :class:`ColumnParallelEmbedding1D` (the width split, gathered)
``replicate``,              nothing: every rank holds the module whole (transformers' local-tensor
``local_params``            switch; shardcore's parameters are local already)
``all_reduce``              the module's output summed over the group
``moe_tp_experts``          fused experts cut along their intermediate width: inputs enter the
                            region (gradients all-reduced), the partial output summed
``moe_identity_expert``     the input divided by the group size (the experts' sum adds it back)
``mla_kv_a_proj``           MLA's ``kv_a_proj``: the rotary tail of its output, used on this
                            rank's heads only, gets its gradient all-reduced
``replicated_with_grad_     every parameter of the module whole, its gradient summed over the group
allreduce``
==========================  ==========================================================================

``sequence_parallel`` and any style transformers adds later are refused by name.
"""

from __future__ import annotations

from torch import nn

from ..tensor_parallel import (
    ColumnParallelEmbedding1D,
    InPlace,
    Linear1D_Col,
    Linear1D_Row,
    VocabParallelEmbedding1D,
)
from .syntax import GRAD_SUM, PlanError

#: module styles done with hooks on the module itself: {style: InPlace hook}
HOOKS = {"all_reduce": "reduce", "moe_tp_experts": "partial", "moe_identity_expert": "scale_input"}
#: styles that leave a module (or a parameter) whole
WHOLE = ("replicate", "local_params")


def rope_dim(parent: nn.Module | None, config) -> int | None:
    """MLA's rotary width: the attention's own ``qk_rope_head_dim``, else the config's (a config whose
    layers differ raises on the global read: then ``None``)."""
    value = getattr(parent, "qk_rope_head_dim", None)
    if isinstance(value, int):
        return value
    try:
        return getattr(config, "qk_rope_head_dim", None)
    except Exception:
        return None


def module_layer(
    at: str, path: str, module: nn.Module, style: str, vocab_pad: int, config, parent=None
) -> tuple | None:
    """``(layer class, kwargs)`` for a module given ``style``, ``None`` when it stays whole (and
    needs no hook). The styles of plain linear layers (colwise/rowwise) are specs already."""
    linear = isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward
    embedding = isinstance(module, nn.Embedding) and type(module).forward is nn.Embedding.forward
    if style in WHOLE:
        return None
    if style in HOOKS:
        return InPlace, {"hook": HOOKS[style], "where": path}
    if style == "mla_kv_a_proj":
        tail = rope_dim(parent, config)
        if not isinstance(tail, int):
            raise PlanError(
                f"{at}: {path}: mla_kv_a_proj needs the rotary width (qk_rope_head_dim) of its attention or of "
                "one config for every layer; neither gives one"
            )
        return InPlace, {"hook": "tail_grad", "tail": tail, "where": path}
    if style in ("colwise_gather_output", "colwise_rep") and linear:
        return Linear1D_Col, {"gather_output": True}
    if style in ("rowwise_split_input", "rowwise_rep") and linear:
        return Linear1D_Row, {"input_is_parallel": False}
    if style == "packed_colwise" and linear:
        return Linear1D_Col, {"packed": 2}
    if style == "embedding_rowwise" and embedding:
        return VocabParallelEmbedding1D, {"make_vocab_size_divisible_by": vocab_pad}
    if style == "embedding_colwise" and embedding:
        return ColumnParallelEmbedding1D, {}
    kind = type(module).__name__
    raise PlanError(
        f"{at}: {path} is a {kind}; the style {style!r} applies to "
        + ("a plain nn.Embedding" if style.startswith("embedding") else "a plain nn.Linear or a bare parameter")
        + " here: give it null (replicated) or write a policy"
    )


def param_split(at: str, name: str, param: nn.Parameter, style: str) -> tuple[int, int] | None:
    """``(dim, packed parts)`` a bare parameter given ``style`` is cut along; ``None``: whole."""
    ndim, bias = param.dim(), name.rpartition(".")[2] == "bias"
    if style in WHOLE or style == GRAD_SUM:
        return None
    if style == "colwise":
        return max(ndim - 2, 0), 1
    if style == "rowwise":
        return None if (bias and ndim == 1) else (ndim - 1, 1)
    if style == "packed_colwise":
        return (ndim - 2, 2) if ndim >= 2 else (0, 1)
    if style == "packed_rowwise":
        return None if ndim == 1 else (ndim - 1, 2)
    raise PlanError(f"{at}: {name} is a parameter; the style {style!r} applies to a module")


def linear_spec(at: str, pname: str, owner: nn.Module, spec):
    """A colwise/rowwise style on a plain linear layer's (or embedding's) parameter, as a spec;
    any other spec as it is."""
    plain = isinstance(owner, nn.Linear | nn.Embedding) and pname.rpartition(".")[2] in ("weight", "bias")
    if not (isinstance(spec, str) and plain) or spec == GRAD_SUM:
        return spec
    if spec in ("colwise", "rowwise"):
        column = spec == "colwise"
        if pname.endswith(".bias"):
            return ["tp"] if column else [None]
        return ["tp", None] if column else [None, "tp"]
    if spec in WHOLE:
        return None
    raise PlanError(
        f"{at}: {pname}: the style {spec!r} applies to the module {pname.rpartition('.')[0]}, not to its "
        "parameter; give the module the style"
    )


def config_of(path: str, modules: dict[str, nn.Module], model: nn.Module):
    """The config of the closest module holding ``path`` that has one (a composite's sub-model)."""
    while True:
        config = getattr(modules.get(path), "config", None)
        if config is not None or not path:
            return config if config is not None else getattr(model, "config", None)
        path = path.rpartition(".")[0]
