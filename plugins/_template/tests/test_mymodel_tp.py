"""Sharded MyModel against the unsharded model, on real gloo ranks: lists of cases, the kit's suite doing the
building, the ranks and the checking (shardcore.testing.Family: matches, generates, saves, explains, refuses,
pipelines, generates_through_stages). A test the suite has no method for stays a plain test beside them."""

from __future__ import annotations

from mymodel_cases import VOCAB, batch_for, build

from shardcore.testing import Case, Family, Refusal

MYMODEL = Family(build, batch_for, vocab=VOCAB)

# TP=1 returns the model itself: tested once, in the core
test_matches_unsharded = MYMODEL.matches(
    Case("model-tp2", "MyModel"),  # a class named ...Model (no head): compared on its last hidden state
    Case("model-tp4", "MyModel", tp=4),
    Case("causal-tp2", "MyModelForCausalLM"),
    Case("causal-tp4", "MyModelForCausalLM", tp=4),
)
test_refused_on_every_rank = MYMODEL.refuses(
    Refusal("heads", {"num_attention_heads": 6, "hidden_size": 48}, "num_attention_heads=6 is not divisible"),
)
