"""The BLIP-2 row of ``nox -s matrix`` (benchmarks/matrix.py): a tiny vision tower, Q-Former and OPT."""

from blip2_cases import batch_for, build

CASES = {
    "blip2": {
        "kit": {"zero_grads": ("*.self_attn.k_proj.bias", "*.attention.key.bias")},
        "build": lambda: build(),
        "batch": lambda rows: batch_for(rows=rows),
    }
}
