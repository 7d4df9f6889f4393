"""Sharded GLM and GLM-4 against the unsharded model, on real gloo ranks: lists of cases, the kit's suite doing the
building, the ranks and the checking (outputs, loss, every gradient, 3 AdamW steps; generate; save_pretrained;
explain; refusals)."""

from __future__ import annotations

from glm_cases import VOCAB, batch_for, build

from shardcore.testing import Case, Family, Refusal

GLM = Family(build, batch_for, vocab=VOCAB)
WIDE = {"initializer_range": 0.5}  # larger weights: tokens that vary, so the generation check can fail

test_matches_unsharded = GLM.matches(
    Case("glm-tp2", "GlmForCausalLM"),
    Case("glm-tp4", "GlmForCausalLM", tp=4),  # 2 key/value heads, each on 2 of the 4 ranks
    Case("glm4-tp2", "Glm4ForCausalLM"),
    Case("glm4-tp4", "Glm4ForCausalLM", tp=4),
    Case("glm4-model-tp2", "Glm4Model"),
    Case("glm-classification-tp2", "GlmForSequenceClassification"),
)
test_generate_matches_unsharded = GLM.generates(
    Case("GlmForCausalLM", "GlmForCausalLM", build=WIDE), Case("Glm4ForCausalLM", "Glm4ForCausalLM", build=WIDE)
)
test_save_pretrained_loads_unsharded = GLM.saves(Case("glm4-tp2", "Glm4ForCausalLM"))
test_explain_predicts_a_step = GLM.explains(
    Case("glm-tp2", "GlmForCausalLM"), layer="GlmDecoderLayer", forward={"all_reduce": 2}
)
test_refused_on_every_rank = GLM.refuses(
    Refusal("heads", {"num_attention_heads": 6, "num_key_value_heads": 6}, "num_attention_heads=6 is not divisible"),
    Refusal("intermediate", {"intermediate_size": 130}, "intermediate_size=130 is not divisible"),
)
