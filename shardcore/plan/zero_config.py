"""Zero-config: the tensor-parallel plan a HuggingFace model ships, as a PlanPolicy."""

from __future__ import annotations

from torch import nn

from .policy import PlanPolicy
from .syntax import GRAD_SUM, PlanError, _Plan, _regex

_STYLES = {"colwise": ["tp", None], "rowwise": [None, "tp"]}


def hf_tp_plan(model: nn.Module) -> dict[str, list | str | None] | None:
    """The plan a HuggingFace model's ``config.base_model_tp_plan`` describes, in shardcore's syntax
    (each parameter of a ``replicated_with_grad_allreduce`` module gets that spec); ``None`` if the
    model ships no plan. The embedding and the LM head are split over the vocabulary too
    (transformers keeps them replicated) when they are plain ``nn.Embedding`` / ``nn.Linear``."""
    config = getattr(model, "config", None)
    base_plan = getattr(config, "base_model_tp_plan", None)
    if not base_plan:
        return None
    base = getattr(model, "base_model", model)
    paths = {id(m): n for n, m in model.named_modules()}
    prefix = paths.get(id(base), "")
    prefix = f"{prefix}." if prefix else ""
    specs: dict[str, list | str | None] = {}
    for pattern, style in base_plan.items():
        if style in _STYLES:
            specs[f"{prefix}{pattern}.weight"] = list(_STYLES[style])
        elif style == GRAD_SUM:
            regex = _regex(f"{prefix}{pattern}")
            module = next((m for n, m in model.named_modules() if regex.match(n)), None)
            for pname, _ in module.named_parameters(recurse=False) if module is not None else ():
                specs[f"{prefix}{pattern}.{pname}"] = GRAD_SUM
        else:
            raise PlanError(
                f"{type(model).__name__}: base_model_tp_plan gives {pattern!r} the style {style!r}, which shardcore's "
                f"zero-config fallback does not translate (colwise, rowwise and {GRAD_SUM} are); "
                "write a plan (shardcore plan MODEL writes one to start from) or a plugin"
            )
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    ends = [m for m in (embed, head) if m is not None]
    tied = head is not None and embed is not None and head.weight is embed.weight
    plain = all(type(m).forward in (nn.Embedding.forward, nn.Linear.forward) for m in ends)
    if plain or not tied:  # a tied pair is split together or not at all
        for m in ends:
            if type(m).forward in (nn.Embedding.forward, nn.Linear.forward) and id(m) in paths:
                specs[f"{paths[id(m)]}.weight"] = ["tp", None]
    return specs


def zero_config_policy(model: nn.Module) -> PlanPolicy | None:
    """The fallback policy for a model no plugin covers: its HuggingFace TP plan, if it ships one."""
    specs = hf_tp_plan(model)
    if specs is None:
        return None
    return PlanPolicy(_Plan(specs, {}, f"{type(model).__name__}.config.base_model_tp_plan"))
