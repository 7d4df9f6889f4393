"""The Falcon rows of ``nox -s matrix`` (benchmarks/matrix.py): Falcon-7B's multi-query layout and the
ALiBi one, tiny causal LMs of 4 layers."""

from falcon_cases import VOCAB, build

from shardcore.testing import token_batch

#: ALiBi's scores differ from the unsharded model's in fp32's last bits; over 16 tokens AdamW's first
#: steps (eps 1e-5) carry that to 1.3e-5 in a weight, over the kit's default 1e-5
KIT = {"falcon": {}, "falcon-alibi": {"atol_step": 3e-5}}

CASES = {
    name: {
        "build": lambda layout=layout: build(layout=layout, num_hidden_layers=4),
        "batch": lambda rows: token_batch(VOCAB, rows),
        "kit": KIT[name],
    }
    for name, layout in (("falcon", "multi-query"), ("falcon-alibi", "per-head-alibi"))
}
