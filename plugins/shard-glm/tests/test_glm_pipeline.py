"""GLM-4 in pipeline stages on the model's own forward (partial rotary built on each stage): GPipe at PP=2 and 1F1B
at PP=2 x TP=2, training equal to the unsharded model on the whole batch (the loss, every held gradient, every
parameter after 3 AdamW steps; row 0 left-padded, so its microbatch holds fewer label tokens than the others); greedy
generate() through the stages equal to the unsharded model (tokens and scores)."""

from __future__ import annotations

from glm_cases import VOCAB, batch_for, build

from shardcore.testing import Case, Family

GLM = Family(build, batch_for, vocab=VOCAB)
DEEP = {"build": {"num_hidden_layers": 4}, "batch": {"rows": 4}}
STAGES = {"pipeline_parallel_size": 2, "num_microbatches": 4}

test_pipeline_trains_like_unsharded = GLM.pipelines(
    Case("pp2-gpipe", "Glm4ForCausalLM", tp=1, **DEEP, config={**STAGES, "pipeline_schedule": "GPipe"}),
    Case("pp2-tp2-1f1b", "Glm4ForCausalLM", **DEEP, config={**STAGES, "pipeline_schedule": "1F1B"}),
)
test_generate_through_the_stages = GLM.generates_through_stages(
    Case("pp2", "Glm4ForCausalLM", build={"num_hidden_layers": 4})
)
