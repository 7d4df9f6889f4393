"""Mutants of amp: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "overflow-agreement-dropped",
        "fp16 overflow: each rank decides from its own gradient slices (the flag's all-reduce dropped)",
        "shardcore/amp.py",
        "agree_on_overflow",
        [("    all_reduce(shared, group, op=torch.distributed.ReduceOp.MAX, where=_WHERE)\n", "")],
        "tests/integration/test_llama_amp.py::test_an_overflow_on_one_rank_skips_the_step_on_every_rank[tp2]",
        "stepped [True, True, True]",
    ),
]
