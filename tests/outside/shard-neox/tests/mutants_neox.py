"""Mutants of shard-neox (an outside plugin): the harness runs them like a bundled plugin's, its declared
check being the fresh-environment run of the plugin's tests from its wheel."""

from mutant_kit import m

CHECK = "tests/test_core_outside_plugin.py::test_an_outside_plugin_from_its_wheel_in_a_fresh_environment"

MUTANTS = [
    m(
        "neox-qkv-split-across-heads",
        "shard-neox's head split takes a head's width as head_size, not its q, k and v together",
        "tests/outside/shard-neox/shard_neox/styles.py",
        "qkv_layer",
        [('"head_dim": 3 * head_size,', '"head_dim": head_size,')],
        CHECK,
        "FAILED test_neox.py::test_matches_unsharded[causal-tp2]",
    ),
    m(
        "neox-hook-before-inputs-agree",
        "shard-neox's hook declares no place after same_inputs: it runs before the ranks agree on the batch",
        "tests/outside/shard-neox/shard_neox/policy.py",
        "NeoXPolicy.postprocess",
        [('            after="same_inputs",\n', '            after="scope",\n')],
        CHECK,
        "FAILED test_neox.py::test_the_plugins_own_hook_runs_at_its_declared_place_and_refuses_on_every_rank",
    ),
]
