"""The attention's own rate in the cost model: a model's attention FLOPs priced at the rate ``calibrate`` measured for
its head dim, masked or not (:mod:`shardcore.cost.attention`), the rest of its blocks at the block's rate less the
reference attention's part of it."""

from __future__ import annotations

import math

import pytest
import torch

from shardcore.cost.attention import HEAD_DIMS, SEQ, calls, factors, multipliers, step_flops
from shardcore.cost.facts import StageFacts
from shardcore.cost.measure import BLOCK, block_step_flops
from shardcore.cost.model import predict

SHARE = 1 / 13  # the reference block's attention FLOPs over its whole step's (width 512, MLP 2048, 256 tokens)
TABLE = {"full": {"32": 0.6, "64": 0.75, "128": 0.8}, "causal": {"32": 0.3, "64": 0.35, "128": 0.4},
         "reference": 0.7, "share": SHARE}  # fmt: skip


def test_the_reference_attention_s_share_of_the_block_is_what_the_cost_model_counts():
    width, heads, ffn, batch, seq = BLOCK
    share = step_flops(batch, heads, seq, width // heads, False) / block_step_flops(width, ffn, batch * seq, seq)
    assert share == pytest.approx(SHARE)
    measured = {("full", 64): 30.0, ("causal", 64): 15.0, "reference": 35.0}
    got = factors(measured, block_rate=50.0, share=share)
    want = {"full": {"64": 0.6}, "causal": {"64": 0.3}, "reference": 0.7, "share": share}
    assert got == want, f"the factors not over the block's rate: {got}"


def test_the_multipliers_read_the_head_dim_and_the_mask():
    entry = {"attention_shapes": {"float32": TABLE}}
    rest = (1 - SHARE / 0.7) / (1 - SHARE)
    assert multipliers(entry, "float32", 64, True)[0] == pytest.approx(1 / 0.35), "the mask not read"
    assert multipliers(entry, "float32", 64, False)[0] == pytest.approx(1 / 0.75)
    assert multipliers(entry, "float32", 64, True)[1] == pytest.approx(rest), "the rest at the whole block's rate"
    between = 0.3 + (0.35 - 0.3) * (math.log(48) - math.log(32)) / (math.log(64) - math.log(32))
    assert multipliers(entry, "float32", 48, True)[0] == pytest.approx(1 / between), "not log-linear in the head dim"
    assert multipliers(entry, "float32", 256, True)[0] == pytest.approx(1 / 0.4), "beyond: the nearest measured"
    assert multipliers(entry, "bfloat16", 64, True)[0] == pytest.approx(1 / 0.35), "an unmeasured dtype: the first"
    assert multipliers({}, "float32", 64, True) == (1.0, 1.0), "a profile without the shapes: the block's rate"
    assert multipliers(entry, "float32", 0, True) == (1.0, 1.0)


def test_predict_prices_the_attention_at_its_own_rate_and_the_rest_at_the_block_s_less_its_attention():
    """One stage, no loss, no optimizer: compute is 3 x (matmuls x rest + attention / factor) / rate."""
    rank = {"block_flops": {"float32": 1e10}, "block_shapes": {"float32": {"1": {"128": 1.0}}},
            "copy_bytes_per_s": 1e10}  # fmt: skip
    stage = StageFacts(matmul_weights=1000, activation_elements=0, attention_layers=2, dense_bytes=0,
                       expert_bytes=0, dense_tensors=1, blocks=2, logits=0)  # fmt: skip
    seq, heads, dim = 128, 4, 32

    def compute(causal: bool, shapes: dict | None) -> float:
        facts = {"seq": seq, "batch": 2, "dtype": "float32", "itemsize": 4, "attention": (heads, dim, causal),
                 "stages": [stage]}  # fmt: skip
        layout = {"dp": 1, "pp": 1, "sp": 1, "tp": 1, "ep": 1, "microbatches": 1, "data_parallel": None}
        entry = rank | ({"attention_shapes": {"float32": shapes}} if shapes else {})
        profile = {"per_rank": {"1": entry}, "collectives": {}}
        return predict(facts, layout, profile, optimizer="none")["compute_s"]

    tokens = 2 * seq
    matmuls = tokens * 2 * 1000
    attention = tokens * 2 * 4 * seq * heads * dim * 0.5  # causal: half the scores counted
    rest = (1 - SHARE / 0.7) / (1 - SHARE)
    assert compute(True, None) == pytest.approx(3 * (matmuls + attention) / 1e10), "an old profile: changed"
    assert compute(True, TABLE) == pytest.approx(3 * (matmuls * rest + attention / 0.3) / 1e10), "attention unpriced"
    assert compute(False, TABLE) == pytest.approx(3 * (matmuls * rest + 2 * attention / 0.6) / 1e10)


def test_calibrate_times_each_head_dim_masked_and_not_and_the_reference_block_s_own(monkeypatch):
    """The calls ``calibrate`` times: one sequence of 512 at each head dim (the reference block's width in heads),
    the masked ones through the kernel's causal mask, their FLOPs counted half; the reference block's attention at
    its own shape, unmasked."""
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, is_causal=False):
        seen.append((tuple(q.shape), is_causal))
        return sdpa(q, k, v, is_causal=is_causal)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    made = calls(torch.device("cpu"), torch.float32, 512, (2, 256, 64))
    assert set(made) == {(m, d) for m in ("full", "causal") for d in HEAD_DIMS} | {"reference"}
    for key, (run, flops) in made.items():
        seen.clear()
        run()
        if key == "reference":
            assert seen == [((2, 8, 256, 64), False)] and flops == step_flops(2, 8, 256, 64, False)
            continue
        mask, dim = key
        assert seen == [((1, 512 // dim, SEQ, dim), mask == "causal")], f"{key}: the masked attention timed unmasked"
        assert flops == step_flops(1, 512 // dim, SEQ, dim, mask == "causal")
    assert step_flops(1, 8, 512, 64, True) == step_flops(1, 8, 512, 64, False) / 2
