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
]
