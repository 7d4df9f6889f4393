"""A user's own model (plain ``torch.nn``, no HF conventions) sharded by a YAML plan: exact or refused.

The model and the plan are ``examples/own_model.py`` / ``own_model.yaml`` (a nanoGPT-shaped LM,
vocabulary 212): the sharded model returns the whole vocabulary's logits and the user's own
``F.cross_entropy`` on them is the unsharded loss, its gradients and AdamW steps the unsharded ones
(fp32: outputs 1e-5 absolute, loss 1e-6 and gradients 1e-4 relative, the conformance kit's bounds);
a norm over the split width is refused at ``optimize`` naming the module; a scale no plan names
gets its gradient summed; a vocabulary of 211 is padded. The checks at ``optimize`` run on it, with
and without ``ShardConfig(example_inputs=...)``.
"""

from __future__ import annotations

import logging
import pathlib

import pytest
import torch
import torch.nn.functional as F

from shardcore import ShardConfig
from shardcore.testing import assert_sharded_matches, example_main, refusal_message, run_on_ranks

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "own_model.py"


def _example():
    return example_main(EXAMPLE).__globals__


def _user_loss(targets: torch.Tensor):
    """The user's own loss: ``F.cross_entropy`` on whole logits, the vocab-parallel one on a slice."""
    import shardcore
    from shardcore.tensor_parallel.vocab_slice import slice_of

    def loss(logits: torch.Tensor) -> torch.Tensor:
        if slice_of(logits) is not None:
            return shardcore.vocab_parallel_cross_entropy(logits.flatten(0, 1), targets.flatten())
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return loss


def _matches(tp: int, variant: dict, config: dict | None = None) -> dict:
    from shardcore.tensor_parallel import gather_vocab

    ex = _example()
    vocab = variant.get("vocab", 212)
    ids, targets = ex["batch"](vocab)
    config = ShardConfig(tensor_parallel_size=tp, plan=ex["PLAN"], **(config or {}))
    records = _log()
    try:
        report = assert_sharded_matches(
            lambda: ex["NanoLM"](**variant),
            {"input_ids": ids},
            config,
            loss_fn=_user_loss(targets),
            sharded_output_fn=(lambda model, logits: gather_vocab(logits)) if config.parallel_output else None,
        )
    finally:
        logging.getLogger("shardcore").removeHandler(records.handler)
    return {**report, "log": records.messages}


class _log:
    """The messages the ``shardcore`` logger gives while it is attached."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.handler = logging.Handler()
        self.handler.emit = lambda record: self.messages.append(record.getMessage())
        logging.getLogger("shardcore").addHandler(self.handler)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize(
    "variant", [{}, {"vocab": 211}, {"scalar": True}], ids=["plan-as-written", "vocab-211", "unnamed-scale"]
)
def test_own_model_with_a_yaml_plan_is_the_unsharded_model(tp, variant):
    """Whole-vocabulary logits (the kit compares shapes and values), the user's cross entropy, every
    gradient and three AdamW steps: the unsharded model's. The block check ran (no 'did not run')."""
    for report in run_on_ranks(tp, _matches, tp, variant):
        assert not any("did not run" in m for m in report["log"]), report["log"]
        if "scalar" in variant:  # found by the block check, summed from then on
            assert any("Block.mlp.scale are replicated but act on split activations" in m for m in report["log"])


def _logits_shape(tp: int) -> tuple:
    ex = _example()
    torch.manual_seed(0)
    import shardcore

    # verify=False: the gather itself is checked here, not the block check that would refuse a slice
    config = ShardConfig(tensor_parallel_size=tp, plan=ex["PLAN"], verify=False)
    model = shardcore.optimize(ex["NanoLM"](), config)
    return tuple(model(ex["batch"]()[0]).shape)


def test_the_head_s_split_comes_back_whole():
    """The issue's symptom, directly: (3, 11, 106) per rank before; (3, 11, 212) on every rank now."""
    shapes = run_on_ranks(2, _logits_shape, 2)
    assert shapes == [(3, 11, 212), (3, 11, 212)], f"the head's split came back as each rank's slice: {shapes}"


@pytest.mark.parametrize("tp", [2, 4])
def test_the_example_trains_like_the_unsharded_model(tp):
    """examples/own_model.py as torchrun runs it (the user's loop: cross entropy, clip_grad_norm_, AdamW)."""
    unsharded = example_main(EXAMPLE)(["--unsharded"])
    for got in run_on_ranks(tp, example_main(EXAMPLE), ["--tp", str(tp)]):
        assert got["logits_shape"] == unsharded["logits_shape"] == (3, 11, 212)
        for a, b in zip(got["losses"], unsharded["losses"], strict=True):
            assert abs(a - b) <= 1e-5 * abs(b), (got, unsharded)


@pytest.mark.parametrize("tp", [2, 4])
def test_the_example_on_vocabulary_slices_trains_like_the_unsharded_model(tp):
    """parallel_output=True in the example: shardcore.vocab_parallel_cross_entropy on each rank's slice
    (no clipping in that loop: the unsharded run below is the same loop without it)."""
    unsharded = example_main(EXAMPLE)(["--unsharded", "--steps", "1"])
    for got in run_on_ranks(tp, example_main(EXAMPLE), ["--tp", str(tp), "--parallel-output", "--steps", "1"]):
        assert got["slice_width"] < 212 and got["logits_shape"] == (3, 11, 212), got
        assert abs(got["losses"][0] - unsharded["losses"][0]) <= 1e-5 * abs(unsharded["losses"][0]), (got, unsharded)


def _refused(tp: int, example: bool) -> dict:
    ex = _example()
    records = _log()
    inputs = ex["batch"]()[0][:, :5] if example else None
    try:
        config = ShardConfig(tensor_parallel_size=tp, plan=ex["PLAN"], example_inputs=inputs)
        message = refusal_message(lambda: ex["NanoLM"](stat_norm=True), config, collectives_allowed=True)
    finally:
        logging.getLogger("shardcore").removeHandler(records.handler)
    return {"message": message, "log": records.messages}


@pytest.mark.parametrize("example", [False, True], ids=["inputs-found", "example_inputs"])
def test_a_norm_over_the_split_width_is_refused_at_optimize_by_name(example):
    """An affine-less LayerNorm(96) between up and down: at optimize, naming the module (not a shape
    error inside torch at the first forward); the block check ran, on found or given inputs."""
    for result in run_on_ranks(2, _refused, 2, example):
        message = result["message"]
        assert "the sharded model does not compute what the unsharded one did" in message, message
        assert "blocks.0.mlp.norm (LayerNorm) raised" in message, message
        assert "computes over its whole width" in message, message
        assert not any("did not run" in m for m in result["log"]), result["log"]


def _parallel_output(tp: int) -> dict:
    import shardcore
    from shardcore.tensor_parallel import VocabSlice

    ex = _example()
    ids, targets = ex["batch"]()
    torch.manual_seed(0)
    config = ShardConfig(tensor_parallel_size=tp, plan=ex["PLAN"], parallel_output=True)
    model = shardcore.optimize(ex["NanoLM"](), config)
    logits = model(ids)
    try:  # targets every rank's slice holds: a silently wrong number, as in the issue, were it not refused
        F.cross_entropy(logits.flatten(0, 1), targets.flatten() % 16)
        refused = "no error"
    except shardcore.VocabSliceError as err:
        refused = str(err)
    report = _matches(tp, {}, {"parallel_output": True})  # vocab_parallel_cross_entropy on the slices
    return {"slice": isinstance(logits, VocabSlice), "width": logits.shape[-1], "refused": refused, **report}


@pytest.mark.parametrize("tp", [2, 4])
def test_parallel_output_keeps_the_slice_and_refuses_a_whole_logits_loss(tp):
    """parallel_output=True: each rank's vocabulary slice, marked; F.cross_entropy on it raises (naming
    shardcore.vocab_parallel_cross_entropy), which gives the unsharded loss and gradients."""
    for rank, result in enumerate(run_on_ranks(tp, _parallel_output, tp)):
        assert result["slice"], result
        assert result["width"] < 212, result
        assert "use shardcore.vocab_parallel_cross_entropy(logits, targets)" in result["refused"], (rank, result)


def _trunk(tp: int) -> dict:
    ex = _example()

    class Trunk(ex["NanoLM"]):
        """The model's hidden states out (no head): every split is reduced by a row before the output."""

        def forward(self, input_ids):
            x = self.embed(input_ids)
            for block in self.blocks:
                x = block(x)
            return self.norm(x)

    plan = {**_plan(), "head.weight": None}
    ids = ex["batch"]()[0]
    config = ShardConfig(tensor_parallel_size=tp, plan=plan)
    records = _log()
    try:
        report = assert_sharded_matches(
            Trunk, {"input_ids": ids}, config, loss_fn=lambda h: (h**2).mean(), zero_grads=("head.",)
        )
    finally:
        logging.getLogger("shardcore").removeHandler(records.handler)
    return {**report, "log": records.messages}


def _plan() -> dict:
    import yaml

    return yaml.safe_load(_example()["PLAN"].read_text())


def test_splits_reduced_inside_the_model_are_not_gathered():
    """A trunk returning hidden states: the walk from its output stops at each row-parallel layer, so
    no column is gathered (a gathered column would feed its row the whole width)."""
    for result in run_on_ranks(2, _trunk, 2):
        taken = [m for m in result["log"] if "leave the model" in m]
        assert not taken, f"a column was taken for leaving the model: {taken}"


def _derived_shape(tp: int) -> tuple:
    import shardcore

    ex = _example()
    torch.manual_seed(0)
    model = shardcore.optimize(ex["NanoLM"](), ShardConfig(tensor_parallel_size=tp, plan="derive"))
    return tuple(model(ex["batch"]()[0]).shape)


def test_derive_and_a_plan_agree_on_what_comes_back():
    assert run_on_ranks(2, _derived_shape, 2) == [(3, 11, 212), (3, 11, 212)]


def _prime_width(tp: int) -> str:
    ex = _example()
    plan = {"blocks.*.mlp.up.weight": ["tp", None], "blocks.*.mlp.down.weight": [None, "tp"]}
    return refusal_message(lambda: ex["NanoLM"](inner=97), ShardConfig(tensor_parallel_size=tp, plan=plan))


def test_a_width_that_no_size_divides_is_refused_without_an_impossible_fix():
    for message in run_on_ranks(2, _prime_width, 2):
        assert "blocks.0.mlp.up.weight dim 0 has size 97, not divisible by tp=2" in message, message
        assert "no tensor_parallel_size up to 64 divides 97: give it null (replicated)" in message, message


def _odd_outputs(tp: int) -> dict:
    import copy
    import dataclasses

    import shardcore

    ex = _example()
    ids, targets = ex["batch"]()

    @dataclasses.dataclass
    class Out:
        logits: torch.Tensor
        inner: list

    class Returning(ex["NanoLM"]):
        """A dataclass out, with each block's split MLP activation (read by the row layer too) in it."""

        def forward(self, input_ids):
            inner = []
            handles = [b.mlp.up.register_forward_hook(lambda m, a, o: inner.append(o)) for b in self.blocks]
            logits = super().forward(input_ids)
            for h in handles:
                h.remove()
            return Out(logits, inner)

    records = _log()
    try:
        torch.manual_seed(0)
        model = shardcore.optimize(Returning(), ShardConfig(tensor_parallel_size=tp, plan=ex["PLAN"], verify=False))
        out = model(ids)
        torch.manual_seed(0)
        sliced = shardcore.optimize(
            ex["NanoLM"](), ShardConfig(tensor_parallel_size=tp, plan=ex["PLAN"], parallel_output=True)
        )(ids)
        try:
            F.cross_entropy(sliced.transpose(1, 2), targets % 16)
            transposed = "no error"
        except shardcore.VocabSliceError as err:
            transposed = str(err)
        copied = type(copy.deepcopy(sliced.detach())).__name__
    finally:
        logging.getLogger("shardcore").removeHandler(records.handler)
    return {
        "logits": tuple(out.logits.shape),
        "inner": tuple(out.inner[0].shape),
        "log": records.messages,
        "transposed": transposed,
        "copied": copied,
    }


def test_a_dataclass_output_a_returned_split_and_a_transposed_slice():
    """A head returned inside a dataclass is found and gathered; a column output the model returns and
    a row layer reads stays split (named in a warning), not gathered into the row's input; a slice
    transposed for F.cross_entropy is still refused; a deep copy of a slice is a plain tensor."""
    for result in run_on_ranks(2, _odd_outputs, 2):
        assert result["logits"] == (3, 11, 212), result
        assert result["inner"] == (3, 11, 48), result
        assert any("blocks.0.mlp.up, blocks.1.mlp.up feed row-parallel layers" in m for m in result["log"]), result
        assert "use shardcore.vocab_parallel_cross_entropy" in result["transposed"], result
        assert result["copied"] == "Tensor", result


def nano_lm() -> torch.nn.Module:
    """The example's model (module-level: every rank ``shardcore.check`` starts imports it)."""
    return _example()["NanoLM"]()


def nano_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The user's own loss on the whole logits the sharded model returns."""
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def test_check_takes_the_users_own_loss_for_a_plain_module():
    """``shardcore.check`` on a plain ``nn.Module`` whose output has no loss: ``loss_fn(output, labels)``, the
    model called with the batch but its labels, on every rank and on the unsharded model alike; the card
    compares that loss, every gradient and the parameters after the steps. With a pipeline (whose last stage
    computes the model's own loss) refused before any process starts."""
    import shardcore

    ids, targets = _example()["batch"](212)
    batch = {"input_ids": ids, "labels": targets}
    config = ShardConfig(tensor_parallel_size=2, plan=str(_example()["PLAN"]))
    card = shardcore.check(nano_lm, config, batch=batch, loss_fn=nano_loss)
    assert card.passed and card.world == 2, card.format()
    assert (
        any(r.what.startswith("loss, step") for r in card.rows)
        and sum(r.what.startswith("gradients") for r in card.rows) > 1
    ), card.format()
    with pytest.raises(ValueError, match="loss_fn= with pipeline_parallel_size=2"):
        shardcore.check(
            nano_lm, ShardConfig(tensor_parallel_size=1, pipeline_parallel_size=2), batch=batch, loss_fn=nano_loss
        )
