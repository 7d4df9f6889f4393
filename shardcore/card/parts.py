"""The parts of a model the check card groups its parameters by, read from the unsharded model's
structure and names (no family's knowledge): a vision tower or projector, the head, embeddings,
norms, experts and router, attention, MLP, anything else."""

from __future__ import annotations

from torch import nn

__all__ = ["PARTS", "name_groups", "parts_of"]

PARTS = ("embeddings", "attention", "mlp", "experts and router", "norms", "vision tower or projector", "head", "other")

_VISION = ("vision", "visual", "image", "projector", "patch")
_EXPERTS = ("experts", "router", "gate", "shared_expert", "shared_experts", "block_sparse_moe")
_ATTENTION = ("attn", "attention")
_MLP = ("mlp", "ffn", "feed_forward", "intermediate", "fc1", "fc2", "dense_h_to_4h", "dense_4h_to_h")


def _words(name: str) -> list[str]:
    return name.split(".")[:-1]  # the modules' names, not the parameter's own ("weight", "bias")


def _head_modules(model: nn.Module) -> set[int]:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    found = {id(head)} if isinstance(head, nn.Module) else set()
    for name in ("lm_head", "classifier", "score", "qa_outputs", "proj_out"):
        module = getattr(model, name, None)
        if isinstance(module, nn.Module):
            found.add(id(module))
    return found


def parts_of(model: nn.Module) -> dict[str, str]:
    """``{parameter name: part}`` for every parameter of ``model`` under each of its names (a tied
    weight is where the unsharded model first names it)."""
    modules = dict(model.named_modules())
    heads = _head_modules(model)
    owner_of = {}
    for mname, module in modules.items():
        for pname, _ in module.named_parameters(prefix=mname, recurse=False):
            owner_of[pname] = module
    out = {}
    for name, _ in model.named_parameters(remove_duplicate=False):
        owner, words = owner_of.get(name), _words(name)
        if any(w.startswith(_VISION) or w.endswith(_VISION) for w in words):
            out[name] = "vision tower or projector"
        elif owner is not None and id(owner) in heads:
            out[name] = "head"
        elif isinstance(owner, nn.Embedding) or any("embed" in w for w in words):
            out[name] = "embeddings"
        elif (owner is not None and "norm" in type(owner).__name__.lower()) or any("norm" in w for w in words[-1:]):
            out[name] = "norms"
        elif any(w in _EXPERTS for w in words):
            out[name] = "experts and router"
        elif any(a in w for w in words for a in _ATTENTION):
            out[name] = "attention"
        elif any(m in w for w in words for m in _MLP):
            out[name] = "mlp"
        else:
            out[name] = "other"
    return out


def name_groups(model: nn.Module) -> list[list[str]]:
    """Each parameter of ``model`` under all its names (a tied weight's several), in module order."""
    aliases: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    return list(aliases.values())
