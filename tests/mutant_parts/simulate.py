"""Mutants of the simulated world (one process as one rank, torch's fake backend): each a deliberate
bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

_TEST = "tests/test_core_simulate.py"

MUTANTS = [
    m(
        "simulated-rank-holds-the-whole-model",
        "the simulation measures a rank built with the whole model instead of its shard",
        "benchmarks/bench_simulate.py",
        "make",
        [
            (
                "        model = shardcore.optimize(build(cfg, device, dtype), shard_config(name, batch, KERNELS.get(kernel)))",
                "        model = build(cfg, device, dtype)",
            )
        ],
        f"{_TEST}::test_each_simulated_rank_holds_what_explain_predicts",
        "parameter bytes held",
    ),
    m(
        "memory-per-rank-stage-ignored",
        "explain's memory for a pipeline stage is the largest stage's, whichever stage is asked",
        "shardcore/cost/memory.py",
        "memory_per_rank",
        [("        if s == index:", "        if False:")],
        f"{_TEST}::test_each_simulated_rank_holds_what_explain_predicts",
        "tp2-pp4-first (rank",
    ),
    m(
        "simulated-stage-shapes-without-gradients",
        "a simulated pipeline tells torch its stages' outputs carry no gradient: the backward cannot run",
        "shardcore/pipeline/simulated.py",
        "_meta",
        [(".requires_grad_(t.is_floating_point())", ".requires_grad_(False)")],
        f"{_TEST}::test_every_layout_runs_on_one_simulated_rank",
        "bench_simulate.py --tiny failed",
    ),
    m(
        "simulated-data-checks-left-on",
        "a simulated rank keeps the input check on, comparing data no collective brought",
        "shardcore/distributed/simulate.py",
        "without_data_checks",
        [("    return attrs.evolve(config, **DATA_CHECKS)", "    return config")],
        f"{_TEST}::test_a_simulated_rank_says_what_it_cannot_check",
        "a simulated rank's data checks are still on",
    ),
]
