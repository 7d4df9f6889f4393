"""The GPT-2 row of ``nox -s matrix`` (benchmarks/matrix.py): a tiny causal LM, 4 layers, tied head."""

from gpt2_cases import VOCAB, build

from shardcore.testing import token_batch

CASES = {"gpt2": {"build": lambda: build(layers=4), "batch": lambda rows: token_batch(VOCAB, rows)}}
