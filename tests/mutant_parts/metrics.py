"""Mutants of metrics: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

T = "tests/test_core_metrics.py::"
MUTANTS = [
    m(
        "metrics-tensor-parallel-ranks-counted-as-parts",
        "tokens/s sums every rank's tokens: the tensor-parallel ranks of a data-parallel part count its tokens twice",
        "shardcore/metrics.py",
        "StepMetrics._metrics",
        [
            (
                "        tokens = sum(r[0] for r in rows) / (self.world / self.parts)",
                "        tokens = sum(r[0] for r in rows)",
            )
        ],
        T + "test_step_metrics_of_an_fsdp_by_tp_loop_are_what_the_ranks_did",
        "tokens counted, not two parts' 2 x 16 once",
    ),
    m(
        "metrics-collective-every-step",
        "every step gathers the numbers over the world (a collective and a host sync per step, not per window)",
        "shardcore/metrics.py",
        "StepMetrics.step",
        [("        return self.flush() if self._window == self.log_every else None", "        return self.flush()")],
        T + "test_step_metrics_of_an_fsdp_by_tp_loop_are_what_the_ranks_did",
        "a collective mid-window",
    ),
    m(
        "metrics-embedding-lookup-counted",
        "the model's FLOPs count an embedding that is only looked up as matmul weights",
        "shardcore/metrics.py",
        "_full_numel",
        [("    embeddings = {w for looked_up, w in weights if looked_up} - {", "    embeddings = set() & {")],
        T + "test_flops_per_token_leaves_out_an_embedding_only_looked_up",
        "not 6 x the parameters outside the embedding",
    ),
    m(
        "metrics-tied-head-left-out",
        "the model's FLOPs leave out a head that reuses the embedding's weight (the vocabulary projection's matmul)",
        "shardcore/metrics.py",
        "_full_numel",
        [(" - {w for looked_up, w in weights if not looked_up}", "")],
        T + "test_step_metrics_of_an_fsdp_by_tp_loop_are_what_the_ranks_did",
        "not 6 x every parameter (a tied head's in)",
    ),
    m(
        "metrics-one-stage-counted",
        "under pipeline parallelism the model's FLOPs count only this rank's stage (MFU off by the stages)",
        "shardcore/metrics.py",
        "model_flops_per_token",
        [("    if info is not None and info.layout.pp > 1:\n", "    if False:\n")],
        T + "test_step_metrics_of_a_pipeline_count_each_stage_s_parameters_once",
        "over the stages, unsharded",
    ),
]
