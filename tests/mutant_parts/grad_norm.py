"""Mutants of grad_norm: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "clip-norm-per-rank",
        "the gradient norm left per rank (no sum over the model's ranks)",
        "shardcore/grad_norm.py",
        "grad_norm",
        [
            (
                "        for g in _replica_groups(info, group, main=i == 0):",
                "        for g in _replica_groups(info, group, main=i == 0)[:0]:",
            )
        ],
        "tests/integration/test_llama_clipping.py::test_torch_clip_grad_norm_is_the_unsharded_norm[2]",
        "clip_grad_norm_ (torch, norm_type=2) on rank",
        fast=True,
    ),
    m(
        "clip-replicas-counted-as-slices",
        "replicated KV rows and padding rows counted like split rows in the gradient norm",
        "shardcore/grad_norm.py",
        "_row_weights",
        [("    if not spec.is_replicated and not any(pad for _, _, pad in ranges):", "    if True:")],
        "tests/integration/test_llama_clipping.py::test_other_norms[1.0]",
        "clip_grad_norm_ (torch, norm_type=1) on rank",
    ),
    m(
        "clip-norm-expert-axis-not-reduced",
        "the gradient norm's experts' bucket never summed over the expert-parallel ranks: each rank counts its own experts",
        "shardcore/grad_norm.py",
        "grad_norm",
        [
            (
                "        for g in _replica_groups(info, group, main=i == 0):",
                "        for g in _replica_groups(info, group, main=i == 0) if i == 0 else ():",
            )
        ],
        "plugins/shard-moe/tests/test_moe_card.py::test_the_card_of_mixtral_at_ep2_x_tp2_passes_with_the_experts_compared",
        "FAIL: clip_grad_norm_'s norm",
    ),
]
