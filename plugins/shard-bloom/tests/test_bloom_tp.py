"""Sharded BLOOM against the unsharded model, on real gloo ranks: lists of cases, the kit's suite doing the
building, the ranks and the checking (outputs, loss, every gradient, 3 AdamW steps; generate; save_pretrained;
explain; refusals)."""

from __future__ import annotations

from bloom_cases import VOCAB, batch_for, build

from shardcore.testing import Case, Family, Refusal

# --8<-- [start:suite]
BLOOM = Family(build, batch_for, vocab=VOCAB)
CAUSAL = "BloomForCausalLM"

test_matches_unsharded = BLOOM.matches(
    Case("causal-tp2", CAUSAL),
    Case("causal-tp4", CAUSAL, tp=4),
    Case("no-mask-tp2", CAUSAL, batch={"mask": False}),  # ALiBi built from the key length, not the mask
    Case("model-tp2", "BloomModel"),
    Case("classification-tp4", "BloomForSequenceClassification", tp=4),
)
# larger weights: tokens that vary, so the check can fail
test_generate_matches_unsharded = BLOOM.generates(Case("causal-tp2", CAUSAL, build={"initializer_range": 0.5}))
test_save_pretrained_loads_unsharded = BLOOM.saves(Case("causal-tp2", CAUSAL))
test_explain_predicts_a_step = BLOOM.explains(Case("causal-tp2", CAUSAL), layer="BloomBlock", forward={"all_reduce": 2})
test_refused_on_every_rank = BLOOM.refuses(
    Refusal("heads", {"n_head": 6, "hidden_size": 48}, "n_head=6 is not divisible"),
    Refusal("slow-but-exact", {"pretraining_tp": 2, "slow_but_exact": True}, "set slow_but_exact=False"),
)
# --8<-- [end:suite]
