"""Sharded Falcon against the unsharded model, on real gloo ranks, in its three packings of query_key_value: lists
of cases, the kit's suite doing the building, the ranks and the checking (outputs, loss, every gradient, 3 AdamW
steps; generate; save_pretrained; explain; refusals)."""

from __future__ import annotations

from falcon_cases import VOCAB, batch_for, build

from shardcore.testing import Case, Family, Refusal

FALCON = Family(build, batch_for, vocab=VOCAB)
CAUSAL = "FalconForCausalLM"
WIDE = {"initializer_range": 0.5}  # larger weights: tokens that vary, so the generation check can fail

test_matches_unsharded = FALCON.matches(
    Case("mq-tp2", CAUSAL, build={"layout": "multi-query"}),
    Case("mq-tp4", CAUSAL, tp=4, build={"layout": "multi-query"}),  # the one key/value head on 4 ranks
    Case("grouped-tp2", CAUSAL, build={"layout": "grouped"}),
    Case("alibi-tp2", CAUSAL, build={"layout": "per-head-alibi"}),  # ALiBi folded into the per-head mask
    Case("alibi-eager-tp4", CAUSAL, tp=4, build={"layout": "per-head-alibi", "attn": "eager"}),  # added to the scores
    Case("model-tp2", "FalconModel", build={"layout": "grouped", "attn": "eager"}),
    Case("classification-tp2", "FalconForSequenceClassification", build={"layout": "multi-query"}),
)
test_generate_matches_unsharded = FALCON.generates(
    Case("multi-query", CAUSAL, build={"layout": "multi-query", **WIDE}),
    Case("per-head-alibi", CAUSAL, build={"layout": "per-head-alibi", **WIDE}),
)
test_save_pretrained_loads_unsharded = FALCON.saves(Case("grouped-tp2", CAUSAL, build={"layout": "grouped"}))
test_explain_predicts_a_step = FALCON.explains(
    Case("mq-tp2", CAUSAL), layer="FalconDecoderLayer", forward={"all_reduce": 2}
)
test_refused_on_every_rank = FALCON.refuses(
    Refusal("heads", {"num_attention_heads": 6, "hidden_size": 48}, "num_attention_heads=6 is not divisible"),
    Refusal("groups", {"layout": "grouped"}, "num_kv_heads=2 groups cannot be split over tensor_parallel_size=4"),
)
