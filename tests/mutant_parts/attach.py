"""Mutants of attach: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "attach-order-of-registration",
        "the hooks around the forward run in the order features attached them, not shardcore.attach's declared order",
        "shardcore/attach/__init__.py",
        "Attached.in_order",
        [
            (
                "        return [entries[name] for name in order(kind, entries) if name in entries]",
                "        return [e for e in self.entries if e.kind == kind]",
            )
        ],
        "tests/test_core_attach.py::test_hooks_run_in_the_declared_order_whatever_the_order_they_were_attached_in",
        "not shardcore.attach's",
        fast=True,  # CI's subset: attach's
    ),
    m(
        "attach-raised-runs-every-after-hook",
        "after a forward that raised, every after-hook runs on its missing output, not only the always ones",
        "shardcore/attach/__init__.py",
        "Attached._after",
        [("            if not (returned or entry.always):\n", "            if False:\n")],
        "tests/test_core_attach.py::test_a_forward_that_raised_runs_only_the_always_hooks_after_it",
        "after a forward that raised",
    ),
    m(
        "attach-plugin-after-ignored",
        "a plugin's hook's after= is dropped: it runs as early as its before= lets it, ahead of what it follows",
        "shardcore/attach/order.py",
        "order",
        [("        for n in (n for n in entry.after if n in edges):\n", "        for n in ():\n")],
        "tests/test_core_attach.py::test_a_plugins_hook_runs_where_its_declared_place_says_whatever_the_attach_order",
        "not the declared places",
    ),
    m(
        "attach-contradiction-runs-part",
        "hooks whose places contradict each other are not refused: the circle silently never runs",
        "shardcore/attach/order.py",
        "order",
        [("    if len(out) < len(nodes):\n", "    if False:\n")],
        "tests/test_core_attach.py::test_places_that_contradict_each_other_are_refused_and_leave_the_registry_as_it_was",
        "DID NOT RAISE",
    ),
    m(
        "attach-listing-misses-inner-after-hooks",
        "the listing of what is inside the model skips the hooks after a submodule's forward",
        "shardcore/attach/listing.py",
        "inside",
        [
            (
                '(("before", module._forward_pre_hooks), ("after", module._forward_hooks))',
                '(("before", module._forward_pre_hooks),)',
            )
        ],
        "tests/test_core_attach.py::test_the_listing_names_the_hooks_found_inside_the_model_by_function",
        "the hook on lin not listed",
    ),
    m(
        "listing-sees-only-replaced-forwards",
        "describe() lists a module's replaced forward but no other method optimize set on it (an attention's mask "
        "builder run over the whole sequence)",
        "shardcore/attach/listing.py",
        "inside",
        [
            (
                "            if callable(value) and not isinstance",
                '            if name == "forward" and callable(value) and not isinstance',
            )
        ],
        "tests/test_core_recent_families.py::"
        "test_a_mask_the_attention_module_builds_itself_is_built_over_the_whole_sequence[ring_attn]",
        "describe() does not list the mask builder set on the attention modules",
    ),
]
