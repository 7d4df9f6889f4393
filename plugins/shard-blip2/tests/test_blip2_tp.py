"""Sharded BLIP-2 against the unsharded model: its vision encoder and Q-Former by shard-blip2's own
policies, its language model by the plugin covering it (shard-opt, shard-t5)."""

from __future__ import annotations

import pytest
import torch
from blip2_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import (
    assert_explain_matches,
    assert_generate_matches,
    assert_save_pretrained_matches,
    assert_sharded_matches,
    refusal_message,
    run_on_ranks,
)

#: zero in exact arithmetic: a key bias adds the same q.b to every score of a query, which softmax ignores
ZERO_GRADS = ("*.self_attn.k_proj.bias", "*.attention.key.bias")
PARTS = {
    "opt": {"vision_model": "Blip2VisionPolicy", "qformer": "Blip2QFormerPolicy", "language_model": "OPTPolicy"},
    "t5": {"vision_model": "Blip2VisionPolicy", "qformer": "Blip2QFormerPolicy", "language_model": "T5Policy"},
}


def _check(tp: int, language: str) -> dict:  # module level: runs on every rank
    import shardcore

    report = assert_sharded_matches(
        lambda: build(language=language),
        batch_for(language),
        ShardConfig(tensor_parallel_size=tp),
        zero_grads=ZERO_GRADS,
        max_param_fraction=0.6 if tp == 2 else None,
    )
    torch.manual_seed(0)
    model = shardcore.optimize(build(language=language), ShardConfig(tensor_parallel_size=tp))
    parts = {path: type(policy).__name__ for path, policy in model.shardcore.policy.part_policies().items()}
    return {**report, "parts": parts}


@pytest.mark.parametrize(("tp", "language"), [(2, "opt"), (4, "opt"), (2, "t5")], ids=["opt-tp2", "opt-tp4", "t5-tp2"])
def test_matches_unsharded(tp, language):
    for report in run_on_ranks(tp, _check, tp, language):
        assert "max_abs_diff_after_steps" in report, report
        assert report["parts"] == PARTS[language]


def _generate(tp: int, language: str):
    import shardcore

    # larger weights than the defaults (and T5 v1.1's gated-GELU): tokens that vary, so the check can fail
    big = {"init_std": 0.3} if language == "opt" else {"initializer_factor": 3.0, "feed_forward_proj": "gated-gelu"}
    big["scale"] = 1.0  # the vision side at its own initialization: the scores' rounding stays within the kit's bound
    torch.manual_seed(0)
    ref = build(language=language, **big).eval()
    torch.manual_seed(0)
    model = shardcore.optimize(build(language=language, **big), ShardConfig(tensor_parallel_size=tp)).eval()
    kwargs = {"max_new_tokens": 6, "do_sample": False, "use_cache": True}
    return assert_generate_matches(ref, model, **batch_for(language, labels=False), **kwargs).tolist()


@pytest.mark.parametrize("language", ["opt", "t5"])
def test_generate_matches_unsharded(language):
    tokens = run_on_ranks(2, _generate, 2, language)
    assert tokens[0] == tokens[1]


def _save(tp: int, path: str) -> dict:
    return assert_save_pretrained_matches(build, batch_for(), ShardConfig(tensor_parallel_size=tp), path)


def test_save_pretrained_loads_unsharded(tmp_path):
    assert all(r["tensors"] > 0 for r in run_on_ranks(2, _save, 2, str(tmp_path / "ckpt")))


def _refused(tp: int) -> str:
    return refusal_message(lambda: build(num_attention_heads=2), ShardConfig(tensor_parallel_size=tp))


def test_a_part_s_refusal_names_the_part_on_every_rank():
    for message in run_on_ranks(4, _refused, 4):
        assert "Blip2ForConditionalGeneration.language_model (OPTPolicy)" in message, message
        assert "num_attention_heads=2 is not divisible" in message, message


def _explain(tp: int) -> dict:
    # the vision encoder runs on patches, the Q-Former on its queries: explain's bytes (priced at the ids' length) left out
    return assert_explain_matches(build, batch_for(), ShardConfig(tensor_parallel_size=tp), price_bytes=False)


def test_explain_predicts_a_step():
    """explain (meta device) predicts a real step's collectives by kind, each part's, and rank 0's bytes."""
    report = run_on_ranks(2, _explain, 2)[0]
    layers = report["collectives_per_layer"]
    assert layers["Blip2EncoderLayer"]["forward"] == {"all_reduce": 1}, layers  # its MLP: the attention is whole
    assert layers["OPTDecoderLayer"]["forward"] == {"all_reduce": 2}, layers
