"""The Falcon rows of ``nox -s matrix`` (benchmarks/matrix.py): Falcon-7B's multi-query layout and the
ALiBi one, tiny causal LMs of 4 layers."""

from falcon_cases import VOCAB, build

from shardcore.testing import token_batch

#: the kit's own tolerances for both (ALiBi's 1.3e-5 in a weight after AdamW's first steps, over the old
#: absolute 1e-5, is within 1e-2 of the update's own size: shardcore.testing.tolerance)
KIT = {"falcon": {}, "falcon-alibi": {}}

CASES = {
    name: {
        "build": lambda layout=layout: build(layout=layout, num_hidden_layers=4),
        "batch": lambda rows: token_batch(VOCAB, rows),
        "kit": KIT[name],
    }
    for name, layout in (("falcon", "multi-query"), ("falcon-alibi", "per-head-alibi"))
}
