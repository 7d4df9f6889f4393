"""The conformance check of what ``optimize`` attached: ``model.shardcore`` lists it, and the list is the truth."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from ..attach import hook_name

__all__ = ["assert_attachments_listed"]


def assert_attachments_listed(model: nn.Module, run: Callable[[], Any]) -> dict[str, list[str]]:
    """Check that ``print(model.shardcore)`` cannot lie about ``model``, and return what it lists
    (``{"before": names, "after": names, "routes": [method: names]}``):

    * the only hooks shardcore put on the model itself are its dispatchers (the one before the forward
      first among the model's pre-hooks, those after it last), and every other hook there is torch's own
      (its data parallelism's), named in the listing;
    * every method set on the instance over the class's (``forward``, ``generate``, ``clip_grad_norm_``,
      ...) is one the registry routed, and the function there is the one it composed;
    * ``run()`` (a forward of the model) runs exactly the listed hooks, in the listed order.
    """
    reg = model.shardcore.attached
    text = reg.describe()  # what print(model.shardcore) prints
    before, returned, after = reg.dispatchers
    pre = list(model._forward_pre_hooks.values())
    assert pre and pre[0] == before, f"shardcore's dispatcher is not first among the pre-hooks: {pre}"
    post = list(model._forward_hooks.values())
    assert post[-2:] == [returned, after], f"shardcore's dispatchers are not last after the forward: {post}"
    for hook in [*pre[1:], *post[:-2]]:
        name = hook_name(hook)
        assert not name.startswith("shardcore."), f"{name} is on the model outside shardcore's registry"
        assert name in text, f"torch's hook {name} on the model is not in its listing:\n{text}"
    routes = reg.routes()
    for method in routes:
        assert getattr(model, method) is reg.installed[method], f"model.{method} is not what the registry composed"
    for key, value in vars(model).items():
        if callable(value) and hasattr(type(model), key) and not isinstance(value, nn.Module):
            assert key in routes, f"model.{key} is set on the instance but routed through no registry entry"
    run()
    before = [e.name for e in reg.in_order("before")]
    after = [e.name for e in reg.in_order("after")]
    ran = [f"before:{n}" for n in before] + [f"after:{n}" for n in after]
    assert reg.last_run == ran, f"the forward ran {reg.last_run}, the listing says {ran}:\n{text}"
    at = -1
    for name in before:
        found = text.index(f". {name} [", at + 1)
        assert found > at, f"{name} is listed out of its run order:\n{text}"
        at = found
    return {"before": before, "after": after, "routes": [f"{m}: {[e.name for e in c]}" for m, c in routes.items()]}
