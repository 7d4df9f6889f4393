"""Mutants of the feature declarations and the kit's helpers they lean on: each a deliberate bug one
declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "features-kernel-switches-always-declared",
        "a family is said to support a kernel switch that has nothing in it to act on",
        "shardcore/explain/features.py",
        "declared",
        [("        out[name] = _kernel_refusal(model, name)", "        out[name] = None")],
        "tests/test_core_matrix.py::test_the_declarations_have_not_moved_since_the_table[opt]",
        "the declarations changed since",
    ),
    m(
        "kit-rank-local-failure-not-shared",
        "a rank whose own slice fails its check raises alone: the others go on and wait in the next collective",
        "shardcore/testing/agree.py",
        "_on_every_rank",
        [("    if dist.is_initialized():", "    if False:")],
        "tests/test_core_kit_helpers.py::test_a_rank_local_check_that_fails_on_one_rank_fails_on_every_rank",
        "rank 0 went on",
    ),
    m(
        "token-batch-not-padded",
        "the kit's text batch has no padded row: masks and ignored labels go untested",
        "shardcore/testing/batches.py",
        "token_batch",
        [("        mask[0, :3] = 0\n        ids[0, :3] = 0\n", "        ids[0, :3] = 0\n")],
        "tests/test_core_kit_helpers.py::test_token_batch_pads_the_first_row_and_ignores_its_labels",
        "the first row is not left-padded",
    ),
]
