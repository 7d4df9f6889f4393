"""BLOOM in pipeline stages on the model's own forward (ALiBi built on each stage from the mask it is handed): GPipe
at PP=2 and 1F1B at PP=2 x TP=2, training equal to the unsharded model on the whole batch (the loss, every held
gradient, every parameter after 3 AdamW steps; row 0 left-padded, so its microbatch holds fewer label tokens than the
others); greedy generate() through the stages equal to the unsharded model (tokens and scores)."""

from __future__ import annotations

from bloom_cases import VOCAB, batch_for, build

from shardcore.testing import Case, Family

BLOOM = Family(build, batch_for, vocab=VOCAB)
STAGES = {"pipeline_parallel_size": 2, "num_microbatches": 4}

test_pipeline_trains_like_unsharded = BLOOM.pipelines(
    Case(
        "pp2-gpipe",
        "BloomForCausalLM",
        tp=1,
        build={"n_layer": 4},
        batch={"rows": 4},
        config={**STAGES, "pipeline_schedule": "GPipe"},
    ),
    Case(
        "pp2-tp2-1f1b",
        "BloomForCausalLM",
        build={"n_layer": 4},
        batch={"rows": 4},
        config={**STAGES, "pipeline_schedule": "1F1B"},
    ),
)
# weights wide enough that greedy tokens vary (the kit refuses an input that cannot fail)
test_generate_through_the_stages = BLOOM.generates_through_stages(
    Case("pp2", "BloomForCausalLM", build={"n_layer": 4, "initializer_range": 0.5})
)
