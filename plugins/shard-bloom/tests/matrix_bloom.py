"""The BLOOM row of ``nox -s matrix`` (benchmarks/matrix.py): a tiny causal LM with ALiBi, 4 layers."""

from bloom_cases import VOCAB, build

from shardcore.testing import token_batch

CASES = {
    "bloom": {"build": lambda: build("BloomForCausalLM", n_layer=4), "batch": lambda rows: token_batch(VOCAB, rows)}
}
