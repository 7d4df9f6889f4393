"""Mutants of inference: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "parallelize-takes-attentions",
        "parallelize accepts output_attentions=True, whose attention weights each worker holds for its own heads only",
        "shardcore/inference/__init__.py",
        "ParallelModel._call",
        [('        if kwargs.get("output_attentions"):', "        if False:")],
        "tests/test_core_parallelize.py::test_refuses_split_outputs",
        "FlakyLM.forward() got an unexpected keyword argument 'output_attentions'",
        fast=True,
    ),
    m(
        "served-cache-handed-back",
        "parallelize returns rank 0's KV cache (its own heads only) with the outputs",
        "shardcore/inference/served.py",
        "",
        [('    "past_key_values",\n    "cache",\n)', ")")],
        "tests/integration/test_llama_parallelize.py::test_forward_and_generate_match_unsharded[module]",
        "parallelize handed back rank 0's cache of its own heads",
    ),
]
