"""Mutants of consistency: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "input-gate-never-rechecks",
        "the input check runs on the first forward only, not again when the inputs' shapes change",
        "shardcore/consistency.py",
        "InputGate.check",
        [("        if signature != self.last:", "        if self.last is None:")],
        "tests/test_core_consistency.py::test_the_check_runs_on_the_first_forward_and_on_new_shapes_or_always_or_never",
        "input check's all-gathers per forward",
    ),
    m(
        "input-digest-on-the-cpu",
        "the input check's digest made on the CPU whatever the group (an NCCL-only group refuses it)",
        "shardcore/consistency.py",
        "check_inputs",
        [("    mine = _combined(digests, group_device(group))", '    mine = _combined(digests, torch.device("cpu"))')],
        "tests/test_core_devices.py::test_the_input_check_puts_its_digest_where_the_group_needs_it",
        "the input check's digest was made on the CPU",
    ),
]
