"""The kit must fail: deliberately wrong sharded models, each caught by the kit's own check with
its own message (the mutation harness loosens the kit and expects these tests to fail)."""

from __future__ import annotations

import pytest
import torch
from toy_models import ToyLM, ToyPolicy, toy_batch

from shardcore import ShardConfig
from shardcore.testing import RankError, assert_sharded_matches, run_on_ranks


class _GradientOff(ToyPolicy):
    """Sharded right, but block 0's first norm weight gets a gradient 1% too large on every rank."""

    def postprocess(self):
        model = super().postprocess()
        model.blocks[0].norm1.weight.register_hook(lambda g: g * 1.01)
        return model


class _SliceOff(ToyPolicy):
    """Each rank's slice of block 0's fc1 weight is nudged after sharding (the outputs stay close);
    on every rank, so that no rank goes on into a collective the failed ones never join."""

    def postprocess(self):
        model = super().postprocess()
        with torch.no_grad():
            model.blocks[0].fc1.weight[0, 0] += 1e-3
        return model


class _NormRebuilt(ToyPolicy):
    """Sharded right, but block 0's first norm is built anew (ones and zeros) instead of taking the
    model's weights: on a fresh init they are ones and zeros too, so only a kit that varies the
    parameters an init leaves constant sees it."""

    def postprocess(self):
        model = super().postprocess()
        model.blocks[0].norm1 = torch.nn.LayerNorm(model.blocks[0].norm1.normalized_shape)
        return model


class _OutputsOff(ToyPolicy):
    """Sharded right, but the logits the model returns are 0.1% too large (a wrong temperature, a
    rescaled head): the loss is computed inside the forward from the right ones, so gradients and
    steps are right and only the output comparison can see it. 1e-3 of the logits' size lies between
    the kit's bound (1e-5 of it) and a bound loosened to an absolute 1e-2 (the logits are O(1))."""

    def postprocess(self):
        model = super().postprocess()
        model.register_forward_hook(lambda module, args, out: {**out, "logits": out["logits"] * 1.001})
        return model


class _StepOff(ToyPolicy):
    """Sharded right, but from the second forward on (the kit's optimizer steps) block 0's second
    bias moves by 2e-4 more each time, on every rank (a share of an update missed or doubled): 4e-4
    after the kit's 3 steps of lr 1e-3, over 10x the kit's bound (1e-2 of the update's largest move,
    ~3e-3) and under a bound loosened to an absolute 1e-2."""

    def postprocess(self):
        model = super().postprocess()
        calls = []

        def nudge(module, args):
            calls.append(1)
            if len(calls) > 1:
                with torch.no_grad():
                    model.blocks[0].fc2.bias += 2e-4

        model.register_forward_pre_hook(nudge)
        return model


def _check(policy) -> dict:
    return assert_sharded_matches(
        lambda: ToyLM(vocab=128), toy_batch(128), ShardConfig(tensor_parallel_size=2), policy=policy
    )


def test_kit_passes_the_right_model():
    assert all(r["max_rel_err_grads"] <= 1e-4 for r in run_on_ranks(2, _check, ToyPolicy))


def test_kit_fails_on_a_gradient_one_percent_off():
    with pytest.raises(RankError, match=r"gradient of blocks\.0\.norm1\.weight \(gathered\): relative error"):
        run_on_ranks(2, _check, _GradientOff)


def test_kit_fails_on_outputs_a_tenth_of_a_percent_off():
    with pytest.raises(RankError, match=r"output 'logits': max abs diff [0-9.e-]+ > [0-9.e-]+ \(1e-06 \+ 1e-05 x its"):
        run_on_ranks(2, _check, _OutputsOff)


def test_kit_fails_on_a_step_off_by_a_share_of_the_update():
    with pytest.raises(RankError, match=r"parameter blocks\.0\.fc2\.bias after 3 AdamW steps: max abs diff"):
        run_on_ranks(2, _check, _StepOff)


def test_kit_fails_on_a_norm_built_anew_instead_of_from_the_model_s_weights():
    try:
        run_on_ranks(2, _check, _NormRebuilt)
        refused = "nothing (the kit passed)"
    except RankError as exc:
        refused = str(exc)
    assert "blocks.0.norm1.weight: this rank's tensor is not its slice" in refused, (
        f"the kit passed a norm built anew (an init of ones hides it): refused {refused[-300:]!r}"
    )


def test_kit_fails_on_one_ranks_slice():
    with pytest.raises(RankError, match=r"blocks\.0\.fc1\.weight: this rank's tensor is not its slice"):
        run_on_ranks(2, _check, _SliceOff)


def test_kit_compares_outputs_at_any_depth_and_refuses_what_it_cannot():
    from transformers.cache_utils import DynamicCache

    from shardcore.testing.compare import _tensors

    cache = DynamicCache()
    cache.update(torch.ones(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), layer_idx=0)
    out = {"logits": torch.ones(2), "nested": ((torch.ones(1), torch.ones(2)), [torch.ones(3)]), "cache": cache}
    found = _tensors(out)
    assert sorted(found) == ["cache.0.keys", "cache.0.values", "logits", "nested.0.0", "nested.0.1", "nested.1.0"]
    assert sorted(_tensors(out, skip=("cache", "nested"))) == ["logits"]
    with pytest.raises(AssertionError, match=r"output 'extra' is a object, which the kit cannot compare; leave it out"):
        _tensors({"logits": torch.ones(2), "extra": object()})


class _Generates(torch.nn.Module):
    """Stands for a model: its ``generate`` returns the given tokens and per-step scores."""

    def __init__(self, tokens, scores):
        super().__init__()
        self.tokens, self.scores = torch.tensor(tokens), [torch.tensor(s) for s in scores]

    def generate(self, *args, **kwargs):
        import types

        return types.SimpleNamespace(sequences=self.tokens, scores=self.scores)


def _generation_refusal(ref: _Generates, model: _Generates) -> str:
    from shardcore.testing import assert_generate_matches

    try:
        assert_generate_matches(ref, model, min_distinct=3)
    except AssertionError as exc:
        return str(exc)
    return "nothing (the check passed)"


_VARIED = [[9, 1, 2, 3], [9, 4, 5, 6]]  # a prompt token, then three new tokens per row
_SCORES = [[[0.0, 1.0], [2.0, 3.0]]] * 3


@pytest.mark.parametrize(
    ("ref", "model", "says"),
    [
        ((_VARIED, _SCORES), ([[9, 1, 2, 3], [9, 4, 5, 7]], _SCORES), "sharded tokens [[9, 1, 2, 3], [9, 4, 5, 7]]"),
        ((_VARIED, _SCORES), (_VARIED, [[[0.0, 1.0], [2.0, 3.1]]] * 3), "step 0: scores differ by 0.1"),
        ((_VARIED, _SCORES), (_VARIED, [[[0.0, float("-inf")], [2.0, 3.0]]] * 3), "mask other tokens"),
        (([[9, 1, 1, 2], [9, 4, 5, 6]], _SCORES), ([[9, 1, 1, 2], [9, 4, 5, 6]], _SCORES), "barely vary ([1, 1, 2])"),
        (([[9, 1, 2, 3], [9, 1, 2, 3]], _SCORES), ([[9, 1, 2, 3], [9, 1, 2, 3]], _SCORES), "every row got the same"),
    ],
    ids=["tokens", "scores", "masks", "input-that-cannot-fail", "rows-alike"],
)
def test_the_generation_check_fails_on_other_tokens_scores_and_inputs_that_cannot_fail(ref, model, says):
    refused = _generation_refusal(_Generates(*ref), _Generates(*model))
    assert says in refused, f"the generation check refused {refused!r}, not {says!r}"


def test_the_generation_check_passes_the_same_varied_tokens_and_scores():
    assert (
        _generation_refusal(_Generates(_VARIED, _SCORES), _Generates(_VARIED, _SCORES)) == "nothing (the check passed)"
    )


class _RefusesLate(ToyPolicy):
    """Refuses, but only after a collective: a rank that raised there would leave the others waiting."""

    def config_sanity_check(self):
        from shardcore.distributed.objects import barrier

        barrier(None, where="the test: a collective before the refusal")
        raise ValueError("refused after a barrier")


def _late() -> str:
    from shardcore.testing import refusal_message

    try:
        return refusal_message(lambda: ToyLM(vocab=128), ShardConfig(tensor_parallel_size=2), policy=_RefusesLate)
    except AssertionError as exc:
        return f"flagged: {exc}"


def test_kit_flags_a_refusal_that_came_after_a_collective():
    for message in run_on_ranks(2, _late):
        assert message.startswith("flagged: refused only after"), f"the kit took a late refusal as early: {message}"


def test_the_checkpoint_comparison_fails_on_one_changed_value(tmp_path):
    from safetensors.torch import save_file

    from shardcore.testing import assert_same_checkpoint

    for name, last in (("reference", 0.0), ("written", 1e-6)):
        (tmp_path / name).mkdir()
        save_file({"w": torch.tensor([0.0, 0.0, last])}, str(tmp_path / name / "model.safetensors"))
    try:
        assert_same_checkpoint(str(tmp_path / "reference"), str(tmp_path / "written"))
        refused = "nothing (the check passed)"
    except AssertionError as exc:
        refused = str(exc)
    assert refused == "tensor 'w' differs after the save_checkpoint round trip", (
        f"the checkpoint comparison refused {refused!r} for a value 1e-6 off"
    )


def test_a_comparison_fails_just_past_its_bound_and_records_its_margin(tmp_path, monkeypatch):
    """The one check every kit comparison goes through: a difference within its bound passes and
    records its margin (worst / bound) for the running test; one just past it fails with the message."""
    from shardcore.testing import tolerance

    path = tmp_path / "margins.jsonl"
    monkeypatch.setenv(tolerance.MARGINS_ENV, str(path))
    monkeypatch.setattr(tolerance, "_WORST", {})
    assert tolerance.within("output", 0.5e-5, 1e-5, "unused") == 0.5e-5
    tolerance.within("output", 0.25e-5, 1e-5, "unused")  # not this test's worst: not written again
    with pytest.raises(AssertionError, match="just past"):
        tolerance.within("output", 1.01e-5, 1e-5, "just past")
    with pytest.raises(AssertionError, match="not a number"):
        tolerance.within("output", float("nan"), 1e-5, "not a number")
    (row,) = tolerance.read_margins(str(path)).values()
    assert row["ratio"] == pytest.approx(0.5) and row["what"] == "output", row
    assert row["test"].endswith("test_a_comparison_fails_just_past_its_bound_and_records_its_margin"), row
    assert tolerance.OUTPUT.bound(14.0) == pytest.approx(1e-6 + 14.0 * 1e-5)  # the reference's size scales it
