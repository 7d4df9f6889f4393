"""Mutants of meta: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "init-empty-every-thread",
        "init_empty moves the parameters of every thread to meta, not only its own",
        "shardcore/meta.py",
        "init_empty.to_meta",
        [(" or threading.get_ident() != thread:", ":")],
        "tests/test_core_checkpoint.py::test_init_empty_touches_nothing_outside_its_block_and_thread",
        "init_empty moved another thread's new parameters to meta",
    ),
]
