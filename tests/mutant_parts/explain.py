"""Mutants of explain: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "explain-expert-elements-not-bytes",
        "explain --ep counts the experts' elements, not their bytes",
        "shardcore/explain/experts.py",
        "expert_traffic",
        [("p.numel() * p.element_size()", "p.numel()")],
        "plugins/shard-moe/tests/test_moe_expert_parallel.py::test_explain_predicts_a_step[2-2-1]",
        "explain says rank 0 holds 73728 bytes of experts, not 294912",
    ),
    m(
        "explain-region-bytes-in-elements",
        "explain --seq prices a tensor-parallel region's backward all-reduce in elements, not bytes",
        "shardcore/explain/traffic.py",
        "collective_bytes_per_step",
        [
            (
                '            step["backward"]["all_reduce"] += tokens * width * itemsize',
                '            step["backward"]["all_reduce"] += tokens * width',
            )
        ],
        "plugins/shard-llama/tests/test_llama_kernels.py::test_explain_predicts_a_step[gqa]",
        "'backward': {'all_reduce': 9216}} bytes per step",
    ),
    m(
        "explain-ring-one-shift-too-many",
        "explain counts sp ring shifts per attention in the forward, not sp - 1",
        "shardcore/explain/sequence.py",
        "per_attention",
        [
            (
                '        return {"ring_shift": sp - 1}, {"ring_shift": sp}',
                '        return {"ring_shift": sp}, {"ring_shift": sp}',
            )
        ],
        "plugins/shard-llama/tests/test_llama_sequence.py::test_explain_predicts_a_step_over_sp[ring-sp2]",
        "explain predicts {'forward': {'ring_shift': 4, 'all_gather': 1}",
    ),
    m(
        "explain-text-in-decimal-units",
        "explain's text divides by 1000 per unit while naming binary units (KB, MB, GB)",
        "shardcore/explain/report.py",
        "_fmt_bytes",
        [("        n /= 1024", "        n /= 1000")],
        "plugins/shard-llama/tests/test_llama_kernels.py::test_explain_7b_at_tp4",
        "explain's text says 'parameters: 23.7 GB unsharded",
    ),
    m(
        "explain-stage-bytes-all-on-the-first",
        "explain --pp puts everything outside the blocks (final norm, head) on the first stage",
        "shardcore/explain/counts.py",
        "_stage_bytes",
        [("            stage = pp - 1 if seen_block else 0", "            stage = 0")],
        "tests/integration/test_llama_auto.py::test_the_cost_facts_split_a_llama_s_bytes_and_matmul_weights_by_stage_as_counted_by_name",
        "explain --pp 2 says the stages hold",
        fast=True,
    ),
    m(
        "explain-import-error-escapes",
        "explain given a module that cannot be imported ends in a traceback instead of naming the spec",
        "shardcore/explain/source.py",
        "model_source",
        [("    except (ImportError, AttributeError) as err:", "    except AttributeError as err:")],
        "plugins/shard-llama/tests/test_llama_kernels.py::test_explain_table_and_bad_spec",
        "No module named 'no_such_module'",
    ),
    m(
        "explain-builds-a-class-without-its-config",
        "explain calls a HuggingFace class without the config its directory or its default gives",
        "shardcore/explain/__init__.py",
        "load_for_explain",
        [
            (
                "        model = target._from_config(config) if config is not None else target()",
                "        model = target()",
            )
        ],
        "plugins/shard-llama/tests/test_llama_kernels.py::test_explain_table_and_bad_spec",
        "missing 1 required positional argument",
    ),
]
