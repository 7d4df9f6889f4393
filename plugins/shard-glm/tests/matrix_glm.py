"""The GLM and GLM-4 rows of ``nox -s matrix`` (benchmarks/matrix.py): tiny causal LMs, 4 layers."""

from glm_cases import VOCAB, build

from shardcore.testing import token_batch

CASES = {
    name: {
        "build": lambda cls=cls: build(cls, num_hidden_layers=4),
        "batch": lambda rows: token_batch(VOCAB, rows),
    }
    for name, cls in (("glm", "GlmForCausalLM"), ("glm4", "Glm4ForCausalLM"))
}
