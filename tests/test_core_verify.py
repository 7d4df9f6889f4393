"""ShardConfig(verify=...): plans shardcore did not write are checked against the unsharded model,
at optimize (one block of each kind, and the model's output) and at the first backward (every
replicated gradient across the group). Toy models whose plans are wrong in the two ways a real
one was (Apertus: a replicated parameter on split activations; Gemma-3n: a reduction over a
split dimension)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from shardcore import ShardConfig
from shardcore.testing import run_on_ranks

PLAN = {"layers.*.up.weight": ["tp", None], "layers.*.down.weight": [None, "tp"]}


class Normalize(nn.Module):
    """A statistic over the last dimension as a module of its own (no weight, no fixed width: no raise)."""

    def forward(self, y):
        return y / y.norm(dim=-1, keepdim=True)


class Block(nn.Module):
    def __init__(self, width: int, mode: str) -> None:
        super().__init__()
        self.up, self.down, self.mode = nn.Linear(width, 4 * width), nn.Linear(4 * width, width), mode
        self.alpha = nn.Parameter(torch.tensor([0.7]))  # a scalar applied to the split activation
        self.normalize = Normalize()

    def forward(self, x):
        y = self.up(x)
        if self.mode == "scale":
            y = y * self.alpha
        elif self.mode == "norm":  # a reduction over the split width: another number per rank
            y = y / y.norm(dim=-1, keepdim=True)
        elif self.mode == "norm-module":  # the same, in a module of its own: named
            y = self.normalize(y)
        return x + self.down(torch.tanh(y))


class Toy(nn.Module):
    main_input_name = "input_ids"

    def __init__(self, mode: str, *, embeddings: bool = True) -> None:
        super().__init__()
        self.embed, self.head, self.embeddings = nn.Embedding(50, 16), nn.Linear(16, 50), embeddings
        self.layers = nn.ModuleList(Block(16, mode) for _ in range(2))

    def get_input_embeddings(self):
        return self.embed if self.embeddings else None

    def forward(self, input_ids, context=None):
        h = self.embed(input_ids)
        for block in self.layers:
            h = block(h)
        return self.head(h)


class NoProbeInput(Toy):
    """A forward whose second input has no default (and no HF convention): shardcore cannot make up an
    input, so the block check cannot run (it says why)."""

    def forward(self, input_ids, context):
        return super().forward(input_ids, context)


def _ids() -> torch.Tensor:
    return torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(3))


def _grads(model) -> dict:
    from shardcore import full_named_tensors

    (model(_ids(), None) ** 2).mean().backward()
    return dict(full_named_tensors(model, grads=True))


def _run(tp: int, mode: str, embeddings: bool = True, verify=None) -> dict:
    import shardcore

    torch.manual_seed(0)
    ref = Toy(mode)
    expected = {n: g.clone() for n, g in _grads(ref).items() if g is not None}
    torch.manual_seed(0)
    model = Toy(mode) if embeddings else NoProbeInput(mode, embeddings=False)
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("shardcore").addHandler(handler)
    try:
        model = shardcore.optimize(model, ShardConfig(tensor_parallel_size=tp, plan=PLAN, verify=verify))
        try:
            got = _grads(model)
        except shardcore.ShardingCheckError as err:
            return {"first_step": str(err), "log": records}
    except shardcore.ShardingCheckError as err:
        return {"optimize": str(err), "log": records}
    finally:
        logging.getLogger("shardcore").removeHandler(handler)
    worst = {n: ((got[n] - g).abs().max() / g.abs().max()).item() for n, g in expected.items()}
    return {"worst": worst, "log": records}


@pytest.mark.parametrize("tp", [2, 4])
def test_replicated_parameter_on_split_activations_gets_its_gradient_summed(tp):
    """The block check finds alpha's gradient partial (its sum over the group is the unsharded one):
    it is summed from then on, named in a warning, and every gradient equals the unsharded one."""
    for result in run_on_ranks(tp, _run, tp, "scale"):
        assert "worst" in result, f"a partial gradient left unsummed, caught at the first step: {result}"
        assert max(result["worst"].values()) < 1e-5, f"a partial gradient left unsummed: {result['worst']}"
        assert any("Block.alpha are replicated but act on split activations" in m for m in result["log"])


def test_a_plan_that_changes_the_output_is_refused_at_optimize():
    """A normalization over the split width: the block's output differs: refused, naming the block."""
    for result in run_on_ranks(2, _run, 2, "norm"):
        assert "optimize" in result, f"the block check let a wrong plan through: {result}"
        assert "layers.0 (Block): its output differs" in result["optimize"]
        assert "ShardConfig(verify=False)" in result["optimize"]


def test_a_module_computing_another_number_is_named():
    """The same normalization in a module: refused, naming it as the first module whose output differs."""
    for result in run_on_ranks(2, _run, 2, "norm-module"):
        assert "layers.0.normalize is the first module whose output differs" in result.get("optimize", ""), result


def test_the_first_backward_check_names_partial_gradients():
    """No probe input (the block check says it did not run, in a warning): the first backward finds
    alpha's gradient different across the ranks and refuses, naming the parameters and the fix."""
    for result in run_on_ranks(2, _run, 2, "scale", False):
        assert "the block check at optimize did not run (NoProbeInput.forward needs context beside input_ids" in (
            " ".join(result["log"])
        )
        assert "first_step" in result, f"the first-step check let partial gradients through: {result}"
        assert (
            "gradients of layers.0.alpha, layers.1.alpha differ across the tensor-parallel ranks"
            in (result["first_step"])
        )
        assert "replicated_with_grad_allreduce" in result["first_step"]


def test_verify_false_turns_both_checks_off():
    """verify=False: no check (what the switch promises), so the partial gradient goes unsummed."""
    (result, _) = run_on_ranks(2, _run, 2, "scale", False, False)
    assert result["worst"]["layers.0.alpha"] > 0.1


def _derive(tp: int, mode: str) -> dict:
    import shardcore

    torch.manual_seed(0)
    expected = {n: g.clone() for n, g in _grads(Toy(mode)).items() if g is not None}
    torch.manual_seed(0)
    try:
        model = shardcore.optimize(Toy(mode), ShardConfig(tensor_parallel_size=tp, plan="derive"))
    except shardcore.ShardingCheckError as err:
        return {"optimize": str(err)}
    kinds = {n: type(m).__name__ for n, m in model.named_modules() if n.startswith("layers.0.")}
    got = _grads(model)
    return {
        "kinds": kinds,
        "worst": max(((got[n] - g).abs().max() / g.abs().max()).item() for n, g in expected.items()),
    }


@pytest.mark.parametrize("tp", [2, 4])
def test_derived_plan_splits_the_mlp_pair_and_is_verified(tp):
    """plan="derive" on a model with no plugin and no plan: up column, down row, ends by the vocabulary;
    the block check finds alpha partial and sums it; every gradient equals the unsharded one."""
    for result in run_on_ranks(tp, _derive, tp, "scale"):
        assert result["kinds"]["layers.0.up"] == "Linear1D_Col" and result["kinds"]["layers.0.down"] == "Linear1D_Row"
        assert result["worst"] < 1e-5


def test_derived_plan_that_is_wrong_is_refused():
    """A derived plan whose block computes another number (a norm over the split width): refused at optimize."""
    (result, _) = run_on_ranks(2, _derive, 2, "norm")
    assert "layers.0 (Block): its output differs" in result["optimize"]


def test_derive_names_what_it_could_not_read():
    """No repeated block, or none with a pair it can read: a PlanError saying what it looked for and where."""
    from shardcore.plan import PlanError, derived_plan

    with pytest.raises(PlanError, match="no repeated blocks"):
        derived_plan(nn.Sequential(nn.Linear(4, 4)))

    class Gated(nn.Module):  # three linears the pair rule does not explain
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.ModuleDict({"a": nn.Linear(8, 8), "b": nn.Linear(8, 8)}) for _ in range(2))

    with pytest.raises(PlanError, match=r"found in layers\.0 \(ModuleDict\)"):
        derived_plan(Gated())
