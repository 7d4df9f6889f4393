"""Mutants of spec: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "spec-grad-sum-parts-dropped",
        "a composite's gradient sums keep only its own declaration, not its parts' (their norms left at one rank's share)",
        "shardcore/spec/parallel.py",
        "TensorParallelSpec.merge",
        [
            (
                "            grad_sum=(*own.grad_sum, *(under(path, n) for path, p in parts.items() for n in p.grad_sum)),",
                "            grad_sum=own.grad_sum,",
            )
        ],
        "tests/test_core_spec.py::test_a_composite_merges_tensor_parallel_from_its_parts",
        "not the tower's norm under its path",
        fast=True,
    ),
    m(
        "spec-fusible-not-under-part",
        "a composite's fused modules named as inside their part, not from the whole model (compiled at the wrong path)",
        "shardcore/spec/model.py",
        "KernelSpec.merge",
        [("            fusible=(*own.fusible, *((under(path, n), m)", "            fusible=(*own.fusible, *((n, m)")],
        "tests/test_core_spec.py::test_a_composite_merges_kernels_from_its_parts",
        "not named from the whole model",
    ),
    m(
        "spec-part-asked-in-whole-names",
        "a part's checkpoint names asked with the whole model's names, not its own (its renames never match)",
        "shardcore/spec/under.py",
        "inside",
        [
            (
                '    return name[len(path) + 1 :] if name.startswith(f"{path}.") else None',
                '    return name if name.startswith(f"{path}.") else None',
            )
        ],
        "tests/test_core_spec.py::test_a_composite_merges_checkpoints_from_its_parts",
        "a part asked in the whole model's names",
    ),
    m(
        "spec-pipeline-from-a-part",
        "a composite runs its first part's pipeline as its own (the parts' forwards are not the composite's)",
        "shardcore/spec/pipeline.py",
        "PipelineSpec.merge",
        [("        return own\n", "        return own or next(iter(parts.values()), None)\n")],
        "tests/test_core_spec.py::test_a_composite_pipeline_is_its_own_only",
        "the parts' pipelines cannot be joined",
    ),
    m(
        "spec-sequence-from-a-part",
        "a composite runs its first part's sequence modes as its own",
        "shardcore/spec/sequence.py",
        "SequenceSpec.merge",
        [("        return own or cls()\n", "        return next(iter(parts.values()), own or cls())\n")],
        "tests/test_core_spec.py::test_a_composite_sequence_is_its_own_only",
        "the composite took a part's sequence modes as its own",
    ),
    m(
        "spec-legacy-silent",
        "a policy written on 0.x's members is read without the DeprecationWarning naming the new spelling",
        "shardcore/moved.py",
        "warn_legacy",
        [("    if mine:\n", "    if False:\n")],
        "tests/test_core_spec.py::test_a_policy_written_on_0x_members_warns_once_naming_the_new_spelling",
        "DeprecationWarnings for a 0.x policy class, not one",
    ),
    m(
        "spec-attention-registry-unset",
        "the model library's attention registry is never registered (every attention switch refused)",
        "shardcore/spec/attention.py",
        "register_attention_registry",
        [("    _REGISTRY[:] = [registry]\n", "    pass\n")],
        "tests/test_core_spec.py::test_a_sequence_spec_is_read_with_its_defaults",
        "no model library's attention registry is registered",
    ),
    m(
        "composite-drops-a-parts-fsdp-refusal",
        "a composite's data-parallel spec keeps only its own FSDP refusal: a part's experts beside zero-computation "
        "ones sharded by FSDP all the same",
        "shardcore/spec/parallel.py",
        "DataParallelSpec.merge",
        [("sharded_refusal=next((r for r in refusals if r), None)", "sharded_refusal=own.sharded_refusal")],
        "tests/test_core_recent_families.py::test_a_composite_keeps_a_parts_fsdp_refusal",
        "the part's FSDP refusal lost",
    ),
]
