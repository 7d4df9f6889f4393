"""A plan style added from outside the core: one registration, then a plan names it and shards with it.

The style here is a layer kind no built-in style covers: an MLP that keeps its weights as bare,
transposed parameters (``x @ w_in + b_in``, GPT-2's ``Conv1D`` layout), registered by this test module as a
plugin would (``shardcore.plugin_api.register_style``), with nothing under ``shardcore/`` naming it.
"""

from __future__ import annotations

import pathlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shardcore import ShardConfig
from shardcore.plan import PlanError, find_style, load_plan
from shardcore.plugin_api import NOT_HERE, InPlace, Style, register_style
from shardcore.testing import assert_sharded_matches, refusal_message, run_on_ranks

ROOT = pathlib.Path(__file__).resolve().parents[1]


class TransposedMLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w_in = nn.Parameter(torch.randn(dim, hidden) / dim**0.5)
        self.b_in = nn.Parameter(torch.randn(hidden) * 0.1)
        self.w_out = nn.Parameter(torch.randn(hidden, dim) / hidden**0.5)

    def forward(self, x):
        return F.gelu(x @ self.w_in + self.b_in) @ self.w_out


class Net(nn.Module):
    def __init__(self, vocab: int = 48, dim: int = 16, hidden: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.mlps = nn.ModuleList(TransposedMLP(dim, hidden) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids, labels=None):
        x = self.embed(ids)
        for norm, mlp in zip(self.norms, self.mlps, strict=True):
            x = x + mlp(norm(x))
        logits = self.head(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return out


# --8<-- [start:style]
def _transposed_mlp(site):
    """The hidden width split: ``w_in`` by its columns (with ``b_in``), ``w_out`` by its rows; the inputs
    enter the tensor-parallel region and the partial outputs are summed (InPlace's ``partial`` hook)."""
    if not isinstance(site.module, TransposedMLP):
        return NOT_HERE  # refused, naming the module and what the style applies to
    params = {"w_in": (1, 1), "b_in": (0, 1), "w_out": (0, 1)}
    return InPlace, {"params": params, "hook": "partial", "where": site.path}


STYLE = register_style(Style("transposed_mlp", module=_transposed_mlp, applies_to="a TransposedMLP"))
PLAN = {"mlps.*": "transposed_mlp", "head.weight": ["tp", None], "head.bias": ["tp"]}
# --8<-- [end:style]


def _batch():
    ids = torch.randint(0, 48, (2, 6), generator=torch.Generator().manual_seed(3))
    return {"ids": ids, "labels": ids.roll(-1, dims=1)}


def _sharded(tp: int) -> dict:
    return assert_sharded_matches(lambda: Net(), _batch(), ShardConfig(tensor_parallel_size=tp, plan=PLAN))


@pytest.mark.parametrize("tp", [2, 4])
def test_a_style_registered_from_outside_shards_and_matches_the_unsharded_model(tp):
    """The outside style through the whole plan path: read, built, its split checked, and the sharded
    model's outputs, loss, every gradient and the parameters after AdamW steps equal to the unsharded."""
    reports = run_on_ranks(tp, _sharded, tp)
    assert all(r["max_abs_diff_after_steps"] is not None for r in reports), reports


def test_the_plan_reads_the_registered_name_and_refuses_an_unknown_one():
    assert find_style("transposed_mlp") is STYLE
    assert load_plan({"mlps.*": "transposed_mlp"}).specs == {"mlps.*": "transposed_mlp"}
    with pytest.raises(PlanError, match=r"or a plan style \(.*transposed_mlp.*\), got 'transposed_mlpp'"):
        load_plan({"mlps.*": "transposed_mlpp"})


def test_a_second_style_of_a_taken_name_is_refused():
    with pytest.raises(ValueError, match=r"a plan style 'colwise' is registered already"):
        register_style(Style("colwise", module=_transposed_mlp))
    assert find_style("colwise") is not None and find_style("colwise").module is None


def _on_a_linear(tp: int) -> str:
    return refusal_message(lambda: Net(), ShardConfig(tensor_parallel_size=tp, plan={"head": "transposed_mlp"}))


def test_a_style_given_where_it_does_not_apply_is_refused_by_name():
    for message in run_on_ranks(2, _on_a_linear, 2):
        assert "head is a Linear; the style 'transposed_mlp' applies to a TransposedMLP here" in message, message


def test_a_style_declared_as_an_entry_point_loads_when_a_plan_names_it(tmp_path):
    """A distribution's ``shardcore.styles`` entry point: a plan naming the style loads it (the plugin not
    imported before), in a fresh interpreter that sees the distribution on its path."""
    import subprocess
    import sys
    import textwrap

    dist = tmp_path / "outside_styles-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: outside-styles\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[shardcore.styles]\nouter_whole = outside_styles:STYLE\n")
    (tmp_path / "outside_styles.py").write_text(
        "from shardcore.plugin_api import Style\nSTYLE = Style('outer_whole', module=lambda site: None)\n"
    )
    code = textwrap.dedent(
        """
        import sys
        from shardcore.plan import find_style, load_plan
        assert "outside_styles" not in sys.modules
        print(load_plan({"mlps.*": "outer_whole"}).specs, find_style("outer_whole").name, "outside_styles" in sys.modules)
        """
    )
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["{'mlps.*':", "'outer_whole'}", "outer_whole", "True"], done.stdout
