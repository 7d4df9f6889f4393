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

``sequence_parallel`` and any style transformers adds later are refused by name. Each is one
:class:`~shardcore.plan.registry.Style` in the registry every reader of a plan reads; a plugin adds its
own with one registration (:func:`~shardcore.plan.registry.register_style`).
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
from .registry import NOT_HERE, Site, Style, find_style, register_style, style_names
from .syntax import GRAD_SUM, PlanError


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


def _mla(site: Site):
    tail = rope_dim(site.parent, site.config)
    if not isinstance(tail, int):
        raise PlanError(
            f"{site.at}: {site.path}: mla_kv_a_proj needs the rotary width (qk_rope_head_dim) of its attention or "
            "of one config for every layer; neither gives one"
        )
    return InPlace, {"hook": "tail_grad", "tail": tail, "where": site.path}


def _on_linear(cls, **kwargs):
    return lambda site: (cls, dict(kwargs)) if site.plain_linear else NOT_HERE


def _hook(hook: str):
    return lambda site: (InPlace, {"hook": hook, "where": site.path})


def _whole(*_):
    return None


def _bias(name: str) -> bool:
    return name.rpartition(".")[2] == "bias"


def _column_spec(name: str) -> list:
    """colwise on a plain layer's own parameter: its output features split (the bias with them)."""
    return ["tp"] if _bias(name) else ["tp", None]


def _row_spec(name: str) -> list:
    """rowwise on a plain layer's own parameter: its input features split (the bias whole)."""
    return [None] if _bias(name) else [None, "tp"]


_EMBEDDING = "a plain nn.Embedding"
for _style in (
    Style(
        "colwise",
        parameter=lambda name, p: (max(p.dim() - 2, 0), 1),
        plain=_column_spec,
    ),
    Style(
        "rowwise",
        parameter=lambda name, p: None if (_bias(name) and p.dim() == 1) else (p.dim() - 1, 1),
        plain=_row_spec,
    ),
    Style("colwise_gather_output", module=_on_linear(Linear1D_Col, gather_output=True)),
    Style("colwise_rep", module=_on_linear(Linear1D_Col, gather_output=True)),
    Style("rowwise_split_input", module=_on_linear(Linear1D_Row, input_is_parallel=False), role="row"),
    Style("rowwise_rep", module=_on_linear(Linear1D_Row, input_is_parallel=False), role="row"),
    Style(
        "packed_colwise",
        module=_on_linear(Linear1D_Col, packed=2),
        parameter=lambda name, p: (p.dim() - 2, 2) if p.dim() >= 2 else (0, 1),
        role="column",
    ),
    Style("packed_rowwise", parameter=lambda name, p: None if p.dim() == 1 else (p.dim() - 1, 2)),
    Style(
        "embedding_rowwise",
        module=lambda s: (
            (VocabParallelEmbedding1D, {"make_vocab_size_divisible_by": s.vocab_pad}) if s.plain_embedding else NOT_HERE
        ),
        applies_to=_EMBEDDING,
    ),
    Style(
        "embedding_colwise",
        module=lambda s: (ColumnParallelEmbedding1D, {}) if s.plain_embedding else NOT_HERE,
        applies_to=_EMBEDDING,
    ),
    Style("replicate", module=_whole, parameter=_whole, plain=_whole),
    Style("local_params", module=_whole, parameter=_whole, plain=_whole),
    Style("all_reduce", module=_hook("reduce"), role="row"),
    Style("moe_tp_experts", module=_hook("partial"), role="row"),
    Style("moe_identity_expert", module=_hook("scale_input")),
    Style("mla_kv_a_proj", module=_mla),
    # a spec, not a layer: each parameter of the module keeps its whole value, its gradient summed
    Style(GRAD_SUM, parameter=_whole),
):
    register_style(_style)


def _style(at: str, name: str) -> Style:
    found = find_style(name)
    if found is None:
        raise PlanError(f"{at}: {name!r} is no plan style (shardcore knows {', '.join(style_names())})")
    return found


def module_layer(site: Site, style: str) -> tuple | None:
    """``(layer class, kwargs)`` for a module given ``style``, ``None`` when it stays whole (and
    needs no hook)."""
    found = _style(site.at, style)
    layer = found.module(site) if found.module is not None else NOT_HERE
    if layer is NOT_HERE:
        raise PlanError(
            f"{site.at}: {site.path} is a {type(site.module).__name__}; the style {style!r} applies to "
            f"{found.applies_to} here: give it null (replicated) or write a policy"
        )
    return layer


def param_split(at: str, name: str, param: nn.Parameter, style: str) -> tuple[int, int] | None:
    """``(dim, packed parts)`` a bare parameter given ``style`` is cut along; ``None``: whole."""
    found = _style(at, style)
    if found.parameter is None:
        raise PlanError(f"{at}: {name} is a parameter; the style {style!r} applies to a module")
    return found.parameter(name, param)


def linear_spec(at: str, pname: str, owner: nn.Module, spec):
    """A style on a plain linear layer's (or embedding's) own parameter, as a spec (colwise / rowwise);
    any other spec as it is."""
    plain = isinstance(owner, nn.Linear | nn.Embedding) and pname.rpartition(".")[2] in ("weight", "bias")
    if not (isinstance(spec, str) and plain) or spec == GRAD_SUM:
        return spec
    found = _style(at, spec)
    if found.plain is None:
        raise PlanError(
            f"{at}: {pname}: the style {spec!r} applies to the module {pname.rpartition('.')[0]}, not to its "
            "parameter; give the module the style"
        )
    return found.plain(pname)


def config_of(path: str, modules: dict[str, nn.Module], model: nn.Module):
    """The config of the closest module holding ``path`` that has one (a composite's sub-model)."""
    while True:
        config = getattr(modules.get(path), "config", None)
        if config is not None or not path:
            return config if config is not None else getattr(model, "config", None)
        path = path.rpartition(".")[0]


def unchosen_experts(styles: dict[str, tuple[str, str]]) -> str | None:
    """Why FSDP cannot run a plan's model (``DataParallelSpec.sharded_refusal``), from its modules' styles
    ``{path: (key, style)}``: experts beside zero-computation ones, which a rank's tokens may all choose."""
    paths = [p for p, (_, style) in styles.items() if style == "moe_identity_expert"]
    if not paths:
        return None
    return (
        f"{paths[0]} (moe_identity_expert) is a zero-computation expert: a rank whose tokens all choose such experts "
        "leaves the experts' weights beside it without a gradient while another rank's have one, and FSDP "
        "reduce-scatters only the gradients there are (the ranks' collectives would differ)"
    )
