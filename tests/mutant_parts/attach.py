"""Mutants of attach: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "attach-order-of-registration",
        "the hooks around the forward run in the order features attached them, not shardcore.attach's declared order",
        "shardcore/attach.py",
        "Attached.in_order",
        [
            (
                "        return sorted((e for e in self.entries if e.kind == kind), key=lambda e: order.index(e.name))",
                "        return [e for e in self.entries if e.kind == kind]",
            )
        ],
        "tests/test_core_attach.py::test_hooks_run_in_the_declared_order_whatever_the_order_they_were_attached_in",
        "not shardcore.attach's",
    ),
    m(
        "attach-raised-runs-every-after-hook",
        "after a forward that raised, every after-hook runs on its missing output, not only the always ones",
        "shardcore/attach.py",
        "Attached._after",
        [("            if not (returned or entry.always):\n", "            if False:\n")],
        "tests/test_core_attach.py::test_a_forward_that_raised_runs_only_the_always_hooks_after_it",
        "after a forward that raised",
    ),
]
