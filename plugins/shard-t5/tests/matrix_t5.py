"""The T5 row of ``nox -s matrix`` (benchmarks/matrix.py): a tiny encoder-decoder, 2 + 2 layers."""

from t5_cases import batch_for, build

CASES = {"t5": {"build": lambda: build(), "batch": lambda rows: batch_for("T5ForConditionalGeneration", rows=rows)}}
