"""Zero-config: the tensor-parallel plans a HuggingFace model ships, as a PlanPolicy.

A model's config may ship a plan (``base_model_tp_plan``), and so may each of its sub-configs
(``text_config``, ``vision_config``, ... of a vision-language model): each plan shards the
sub-model built from that config, the rest stays whole. Every style transformers ships is
translated with transformers' meaning (:mod:`shardcore.plan.styles`); a style it adds later is
refused by name.
"""

from __future__ import annotations

from torch import nn

from .policy import PlanPolicy
from .registry import find_style, style_names
from .syntax import GRAD_SUM, PlanError, _Plan, _regex

_PLAIN = (nn.Embedding.forward, nn.Linear.forward)


def shipped_plans(model: nn.Module) -> list[tuple[str, dict[str, str], str]]:
    """``(prefix, plan, source)`` for each plan the model's config and sub-configs ship: ``prefix``
    is the path of the sub-model the plan's patterns are relative to (its base model)."""
    config = getattr(model, "config", None)
    if config is None:
        return []
    names = [n for n, _ in (*model.named_modules(), *model.named_parameters())]
    paths = {id(m): n for n, m in model.named_modules()}
    found = []
    name = type(model).__name__

    def add(holder: nn.Module, plan, source: str) -> None:
        # the patterns are relative to the base model built from the same config: the holder's
        # base_model, or the outermost module under it with that config where the patterns match
        base = getattr(holder, "base_model", holder)
        candidates = [base, *(m for m in holder.modules() if getattr(m, "config", None) is holder.config)]
        for module in candidates:
            prefix = paths.get(id(module), "")
            prefix = f"{prefix}." if prefix else ""
            regexes = [_regex(f"{prefix}{p}") for p in plan]  # compiled once per candidate, not per name
            if any(r.match(n) for r in regexes for n in names):
                break
        else:
            prefix = paths.get(id(base), "")
            prefix = f"{prefix}." if prefix else ""
        found.append((prefix, dict(plan), source))

    if getattr(config, "base_model_tp_plan", None):
        add(model, config.base_model_tp_plan, f"{name}.config.base_model_tp_plan")
    for key in getattr(config, "sub_configs", None) or {}:
        sub = getattr(config, key, None)
        plan = getattr(sub, "base_model_tp_plan", None)
        if not plan:
            continue
        holders = [(n, m) for n, m in model.named_modules() if n and getattr(m, "config", None) is sub]
        if holders:  # the outermost module built from this sub-config
            add(min(holders, key=lambda h: h[0].count("."))[1], plan, f"{name}.config.{key}.base_model_tp_plan")
    return found


def hf_tp_plan(model: nn.Module) -> dict[str, list | str | None] | None:
    """The plans a HuggingFace model ships (its config's and its sub-configs'), in shardcore's syntax;
    ``None`` if it ships none. ``colwise`` / ``rowwise`` on plain linear layers become specs of
    their weights, each parameter of a ``replicated_with_grad_allreduce`` module gets that spec, the
    other styles stay as they are (:mod:`shardcore.plan.styles`). The embedding and the LM head are
    split over the vocabulary too (transformers keeps them replicated) when they are plain
    ``nn.Embedding`` / ``nn.Linear`` and no plan names them."""
    plans = shipped_plans(model)
    if not plans:
        return None
    modules = dict(model.named_modules())
    params = dict(model.named_parameters(remove_duplicate=False))
    specs: dict[str, list | str | None] = {}
    for prefix, plan, source in plans:
        for pattern, style in plan.items():
            key = f"{prefix}{pattern}"
            if find_style(style) is None:
                raise PlanError(
                    f"{type(model).__name__}: {source} gives {pattern!r} the style {style!r}, which shardcore's "
                    f"zero-config does not translate (it translates {', '.join(style_names())}); "
                    "write a plan (shardcore plan MODEL writes one to start from) or a plugin"
                )
            regex = _regex(key)
            hits = [m for n, m in modules.items() if regex.match(n)]
            if not hits and not any(regex.match(n) for n in params):
                continue  # a shipped plan covers the family's variants (dense layers, say): not this one's
            if style in ("colwise", "rowwise") and hits and all(type(m).forward is nn.Linear.forward for m in hits):
                specs[f"{key}.weight"] = ["tp", None] if style == "colwise" else [None, "tp"]
            elif style == "embedding_rowwise" and hits and all(type(m).forward is nn.Embedding.forward for m in hits):
                specs[f"{key}.weight"] = ["tp", None]  # the vocabulary split (a tied head follows it)
            elif style == GRAD_SUM and hits:
                for pname, _ in hits[0].named_parameters(recurse=False):
                    specs[f"{key}.{pname}"] = GRAD_SUM
            else:
                specs[key] = style
    split_ends(model, specs)
    return specs


def split_ends(model: nn.Module, specs: dict) -> None:
    """The vocabulary-parallel embedding and LM head, unless a plan names them."""
    paths = {id(m): n for n, m in model.named_modules()}
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(embed, "weight", None)
    ends = [m for m in (embed, head) if m is not None and id(m) in paths]
    # every module sharing an end's weight (a head tied to the embedding that get_output_embeddings
    # does not declare, a decoder's embedding tied to the head) goes with it
    weights = [w for w in (getattr(e, "weight", None) for e in ends) if isinstance(w, nn.Parameter)]
    partners = [
        m for m in model.modules()
        if all(m is not e for e in ends) and any(getattr(m, "weight", None) is w for w in weights)
    ]  # fmt: skip
    ends += [m for m in partners if id(m) in paths]
    regexes = [(_regex(k), v) for k, v in specs.items()]

    def named(m: nn.Module) -> list:
        return [v for r, v in regexes if r.match(paths[id(m)]) or r.match(f"{paths[id(m)]}.weight")]

    tied = bool(partners) or (weight is not None and getattr(head, "weight", None) is weight)
    said = [v for m in ends for v in named(m)]
    if said and tied and any(v != ["tp", None] for v in said):
        return  # the plan keeps the pair whole (or splits it otherwise): its word
    ends = [m for m in ends if not named(m)]
    plain = all(type(m).forward in _PLAIN for m in ends)
    if plain or not tied:  # a tied pair is split together or not at all
        for m in ends:
            if type(m).forward in _PLAIN:
                specs[f"{paths[id(m)]}.weight"] = ["tp", None]


def zero_config_policy(model: nn.Module) -> PlanPolicy | None:
    """The fallback policy for a model no plugin covers: the HuggingFace TP plans it ships, if any, with
    pipeline stages from the pipeline plan it ships (:mod:`shardcore.plan.shipped`)."""
    specs = hf_tp_plan(model)
    if specs is None:
        return None
    from .shipped import ShippedPlanPolicy

    sources = " + ".join(source for _, _, source in shipped_plans(model))
    return ShippedPlanPolicy(_Plan(specs, {}, sources))
