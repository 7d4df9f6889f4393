"""The registry of what optimize attaches (shardcore.attach): one declared run order, one chain per routed
method, and the conformance check that the listing is the truth (single process, a toy module)."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from shardcore.attach import BEFORE_FORWARD, attached
from shardcore.testing import assert_attachments_listed


class _Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)

    def generate(self, x):
        return "the model's own"


def _calls(log: list, name: str, with_kwargs: bool = False):
    if with_kwargs:
        return lambda module, args, kwargs: log.append(name)
    return lambda module, args: log.append(name)


def _after_calls(log: list, name: str):
    return lambda module, args, out: log.append(name)


def test_hooks_run_in_the_declared_order_whatever_the_order_they_were_attached_in():
    model, log = _Toy(), []
    reg = attached(model)
    for name in ("meta_guard", "same_inputs", "scope", "grad_mark"):  # attached out of order
        kwargs = name == "same_inputs"
        reg.before_forward(model, name, _calls(log, name, with_kwargs=kwargs), with_kwargs=kwargs)
    reg.after_forward(model, "scope", lambda module, args, out: log.append("after:scope"), always=True)
    reg.after_forward(model, "overflow_agreement", lambda module, args, out: log.append("after:overflow"))
    model(torch.ones(2, 4))
    assert log == ["scope", "grad_mark", "same_inputs", "meta_guard", "after:overflow", "after:scope"], (
        f"run order {log}, not shardcore.attach's"
    )
    assert reg.last_run == [
        "before:scope",
        "before:grad_mark",
        "before:same_inputs",
        "before:meta_guard",
        "after:overflow_agreement",
        "after:scope",
    ]
    text = reg.describe()
    assert text.index("1. scope") < text.index("2. grad_mark") < text.index("4. meta_guard"), text


def test_a_name_without_a_place_in_the_order_or_attached_twice_is_refused():
    model = _Toy()
    with pytest.raises(ValueError, match=r"hook 'my_feature' has no place: declare it with before= / after="):
        attached(model).before_forward(model, "my_feature", lambda module, args: None)
    with pytest.raises(ValueError, match=r"'my_feature' has no place"):  # a place naming no known hook: none
        attached(model).before_forward(model, "my_feature", lambda module, args: None, after="no_such_hook")
    attached(model).before_forward(model, "scope", lambda module, args: None)
    with pytest.raises(ValueError, match=r"a before-forward hook 'scope' is attached already"):
        attached(model).before_forward(model, "scope", lambda module, args: None)
    assert "my_feature" not in BEFORE_FORWARD and not attached(model).has("before", "my_feature")


def test_a_plugins_hook_runs_where_its_declared_place_says_whatever_the_attach_order():
    """A hook the core does not know (a plugin's) declares before= / after=; scope still brackets it, and
    two plugins' hooks order by their places (then by name), not by which attached first."""
    orders = []
    for names in (("zeta", "alpha", "core"), ("core", "alpha", "zeta"), ("alpha", "core", "zeta")):
        model, log = _Toy(), []
        reg = attached(model)
        for name in names:
            if name == "core":
                for core in ("scope", "same_inputs", "meta_guard"):
                    reg.before_forward(model, core, _calls(log, core))
                reg.after_forward(model, "scope", _after_calls(log, "after:scope"), always=True)
                reg.after_forward(model, "share_copies", _after_calls(log, "after:share_copies"))
            elif name == "alpha":  # after the inputs' check, before zeta (a plugin's hook it knows of)
                reg.before_forward(model, "alpha", _calls(log, "alpha"), after="same_inputs", before=("zeta",))
                reg.after_forward(model, "alpha", _after_calls(log, "after:alpha"), after="share_copies")
            else:  # zeta: before the meta guard; runs after alpha because alpha says so
                reg.before_forward(model, "zeta", _calls(log, "zeta"), before="meta_guard")
        model(torch.ones(2, 4))
        orders.append(log)
    want = ["scope", "same_inputs", "alpha", "zeta", "meta_guard", "after:share_copies", "after:alpha", "after:scope"]
    assert all(log == want for log in orders), f"run orders {orders}, not the declared places {want}"
    assert "alpha [after optimize] (after same_inputs; before zeta)" in reg.describe(), reg.describe()


def test_places_that_contradict_each_other_are_refused_and_leave_the_registry_as_it_was():
    model = _Toy()
    reg = attached(model)
    reg.before_forward(model, "alpha", lambda module, args: None, after="same_inputs")
    with pytest.raises(ValueError, match=r"hooks alpha, beta, same_inputs declare places that contradict"):
        reg.before_forward(model, "beta", lambda module, args: None, before="same_inputs", after="alpha")
    with pytest.raises(ValueError, match=r"contradict"):  # before scope: scope runs first, always
        reg.before_forward(model, "gamma", lambda module, args: None, before="scope")
    assert [e.name for e in reg.in_order("before")] == ["alpha"]
    model(torch.ones(2, 4))


def test_a_forward_that_raised_runs_only_the_always_hooks_after_it():
    model, log = _Toy(), []
    reg = attached(model)
    reg.after_forward(model, "scope", lambda module, args, out: log.append("scope"), always=True)
    reg.after_forward(model, "overflow_agreement", lambda module, args, out: log.append("overflow"))
    with pytest.raises(RuntimeError):
        model(torch.ones(2, 3))  # the wrong width: the forward raises
    assert log == ["scope"], f"after a forward that raised: {log}"
    model(torch.ones(2, 4))
    assert log == ["scope", "overflow", "scope"], log


def test_a_route_composes_in_attach_order_and_comes_off_whole():
    model = _Toy()
    reg = attached(model)
    reg.route(model, "generate", "first", lambda inner: lambda x: f"first({inner(x)})")
    reg.route(model, "generate", "second", lambda inner: lambda x: f"second({inner(x)})")
    assert model.generate(1) == "second(first(the model's own))", model.generate(1)
    assert model.generate is reg.installed["generate"]
    reg.remove(model, "generate", "first")
    assert model.generate(1) == "second(the model's own)", model.generate(1)
    reg.remove(model, "generate", "second")
    assert "generate" not in vars(model) and model.generate(1) == "the model's own"


def test_settle_puts_the_dispatcher_before_hooks_added_later():
    model, log = _Toy(), []
    attached(model).before_forward(model, "scope", _calls(log, "shardcore"))
    model.register_forward_pre_hook(lambda module, args: log.append("torch's"), prepend=True)  # FSDP's, say
    attached(model).finish(model)
    model(torch.ones(2, 4))
    assert log == ["shardcore", "torch's"], f"after settle: {log}"


def _sharded_toy():
    model = _Toy()
    reg = attached(model)
    reg.before_forward(model, "scope", lambda module, args: None)
    reg.after_forward(model, "scope", lambda module, args, out: None, always=True)
    reg.route(model, "generate", "same_sampling", lambda inner: inner)
    model.shardcore = types.SimpleNamespace(attached=reg)
    return model


def test_the_kit_holds_the_listing_to_the_model():
    model = _sharded_toy()
    found = assert_attachments_listed(model, lambda: model(torch.ones(2, 4)))
    assert found == {"before": ["scope"], "after": ["scope"], "routes": ["generate: ['same_sampling']"]}


def test_the_kit_finds_a_shardcore_hook_outside_the_registry():
    model = _sharded_toy()

    def stray(module, args):
        return None

    stray.__module__ = "shardcore.somewhere"
    model.register_forward_pre_hook(stray)
    with pytest.raises(AssertionError, match=r"shardcore\.somewhere\.[\w.<>]*stray is on the model outside"):
        assert_attachments_listed(model, lambda: model(torch.ones(2, 4)))


def test_the_kit_finds_a_method_set_outside_the_registry():
    model = _sharded_toy()
    model.forward = lambda x: x
    with pytest.raises(AssertionError, match=r"model\.forward is set on the instance but routed through no"):
        assert_attachments_listed(model, lambda: model(torch.ones(2, 4)))


def _lin_hook(module, args, output):
    return output


def test_the_listing_names_the_hooks_found_inside_the_model_by_function():
    model = _sharded_toy()
    model.lin.register_forward_hook(_lin_hook)
    text = model.shardcore.attached.describe()
    wanted = ("inside the model (found on its modules):", "after test_core_attach._lin_hook: 1 modules (lin)")
    assert all(line in text for line in wanted), f"the hook on lin not listed:\n{text}"
