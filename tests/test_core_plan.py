"""Sharding plans on a plain-torch model: syntax checks, and a plan against the unsharded model."""

from __future__ import annotations

import pytest
from toy_models import ToyLM, toy_batch

from shardcore import ShardConfig
from shardcore.plan import PlanError, load_plan
from shardcore.testing import assert_sharded_matches, refusal_message, run_on_ranks

TOY_PLAN = {
    "embed.weight": ["tp", None],
    "head.weight": ["tp", None],  # tied to embed.weight: the same spec
    "blocks.*.fc1.weight": ["tp", None],
    "blocks.*.fc1.bias": ["tp"],
    "blocks.*.fc2.weight": [None, "tp"],
    "blocks.*.qkv.weight": None,  # replicated: a packed projection needs a policy to split per head
}


def _toy(tp: int) -> dict:
    return assert_sharded_matches(lambda: ToyLM(), toy_batch(), ShardConfig(tensor_parallel_size=tp, plan=TOY_PLAN))


@pytest.mark.parametrize("tp", [2, 4])
def test_dict_plan_matches_unsharded(tp):
    """A plan splitting the MLPs and the tied vocabulary: outputs, loss, gradients, AdamW steps."""
    run_on_ranks(tp, _toy, tp)


def _untied_head(tp: int) -> str:
    plan = {k: v for k, v in TOY_PLAN.items() if k != "head.weight"}
    return refusal_message(lambda: ToyLM(), ShardConfig(tensor_parallel_size=tp, plan=plan))


def test_tied_parameters_need_one_spec():
    for message in run_on_ranks(2, _untied_head, 2):
        assert "embed.weight, head.weight are one tied parameter" in message, f"a tie split two ways: {message}"


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        ({"a.weight": ["tp", "tp"]}, "splits more than one dimension"),
        ({"a.weight": ["mp", None]}, "unknown mesh axis 'mp'"),
        ({"a.weight": ["dp", "dp"]}, "splits more than one dimension over dp"),
        ({"a.weight": "tp"}, "a spec is a list of mesh axis names or null"),
        ([1, 2], "a sharding plan is a mapping"),
    ],
)
def test_plan_syntax(plan, expected):
    try:
        _load_any(plan)
    except PlanError as err:
        assert expected in str(err), str(err)
    else:
        raise AssertionError(f"the plan {plan!r} was read without an error (expected: {expected})")


def _load_any(plan):
    import collections.abc

    if isinstance(plan, collections.abc.Mapping):
        return load_plan(plan)
    import pathlib
    import tempfile

    import yaml

    path = pathlib.Path(tempfile.mkdtemp()) / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    return load_plan(path)


def test_yaml_lines_are_named(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text("embed.weight: [tp, null]\nblocks.*.fc1.weight: [tp, nul\n")
    with pytest.raises(PlanError, match=r"plan.yaml:\d+: malformed YAML"):
        load_plan(path)
    path.write_text("embed.weight: [tp, null]\n\nblocks.*.fc1.weight: [tensor, null]\n")
    with pytest.raises(PlanError, match=r"plan.yaml:3: 'blocks.\*.fc1.weight': unknown mesh axis 'tensor'"):
        load_plan(path)


def test_a_plan_s_style_names_become_the_specs_its_table_gives():
    """``colwise`` / ``rowwise`` written on a plain linear's parameters (a YAML plan may name styles
    as transformers does): the weight split over its outputs or inputs, the bias with the outputs
    or whole; a style for a module written on another kind of parameter is refused by name."""
    from torch import nn

    from shardcore.plan.styles import linear_spec
    from shardcore.plan.syntax import PlanError

    linear = nn.Linear(4, 4)
    got = {
        (pname, style): linear_spec("plan.yaml:1", f"fc.{pname}", linear, style)
        for pname in ("weight", "bias")
        for style in ("colwise", "rowwise")
    }
    want = {
        ("weight", "colwise"): ["tp", None],
        ("weight", "rowwise"): [None, "tp"],
        ("bias", "colwise"): ["tp"],
        ("bias", "rowwise"): [None],
    }
    assert got == want, f"the styles became {got}"
    with pytest.raises(PlanError, match="applies to the module fc, not to its parameter"):
        linear_spec("plan.yaml:1", "fc.weight", linear, "embedding_rowwise")
