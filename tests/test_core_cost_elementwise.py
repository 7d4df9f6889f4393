"""The cost model's elementwise work (:mod:`shardcore.cost.elementwise`): a model's norms, activations and copies
traced on the meta device by the bytes they move, priced beyond what the reference block's rate already holds."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from shardcore.cost.elementwise import trace
from shardcore.cost.excess import excess_seconds, reference
from shardcore.cost.facts import StageFacts
from shardcore.cost.model import predict

WIDTH, INNER, VOCAB = 16, 24, 50


class Toy(nn.Module):
    """An embedding, a residual MLP, a head; ``extra`` adds one elementwise op (on the residual stream, ``wide``, or
    on the MLP's inner width, ``narrow``), views only (``views``), attention through SDPA (``sdpa``), or a read of a
    token id (``reads``: no meta kernel can answer it)."""

    def __init__(self, extra: str | None = None) -> None:
        super().__init__()
        self.extra = extra
        self.emb, self.up, self.down = nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, INNER), nn.Linear(INNER, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def get_input_embeddings(self) -> nn.Module:
        return self.emb

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(input_ids)
        if self.extra == "reads" and input_ids.max().item() > VOCAB:
            raise AssertionError("unreachable")
        if self.extra == "wide":
            h = h * 2.0
        if self.extra == "sdpa":
            q = h.view(1, -1, 2, WIDTH // 2).transpose(1, 2)
            h = h + nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).reshape(h.shape)
        u = self.up(h)
        if self.extra == "narrow":
            u = u * 2.0
        if self.extra == "views":
            u = u.view(1, -1, 4, INNER // 4).transpose(1, 2).transpose(1, 2).reshape(u.shape)
        return self.head(h + self.down(u))


def traced(extra: str | None = None, seq: int = 7) -> dict | None:
    with torch.device("meta"):
        model = Toy(extra)
    out = trace(model, seq, WIDTH)
    assert all(p.grad is None for p in model.parameters()), "the trace left gradients on the model"
    return out


def test_the_trace_counts_elementwise_bytes_by_how_they_scale_not_matmuls_or_views():
    """One op on the residual stream (forward and backward: its input and output each way) adds its bytes to what
    stays whole under TP; on the MLP's width, to what is split; views add nothing, nor do the matmuls; the
    embedding's gradient is paid once per call whatever the tokens; SDPA is one fused kernel (linear in the tokens,
    where the meta device's decomposition would write the scores)."""
    seq, base = 7, traced()
    assert base["tokens"] == seq and min(base["whole"], base["split"]) > 0, base
    wide = traced("wide")
    assert wide["whole"] - base["whole"] == 4 * seq * WIDTH * 4, "an op on the residual stream: 4 tensors' bytes"
    assert (wide["split"], wide["fixed"], wide["ops"]) == (base["split"], base["fixed"], base["ops"] + 2)
    narrow = traced("narrow")
    assert narrow["split"] - base["split"] == 4 * seq * INNER * 4, "an op on the MLP's width: 4 tensors' bytes"
    assert (narrow["whole"], narrow["fixed"]) == (base["whole"], base["fixed"])
    assert traced("views") == base, "views counted as bytes moved"
    longer = traced(seq=2 * seq)
    assert base["fixed"] > 0 and longer["fixed"] == base["fixed"], "the embedding's gradient counted per token"
    assert (longer["whole"], longer["split"]) == (2 * base["whole"], 2 * base["split"])
    assert traced(seq=INNER)["tokens"] == INNER - 1  # a length dividing a parameter's dimension: one shorter
    attention = traced("sdpa"), traced("sdpa", seq=2 * seq)
    assert attention[1]["split"] + attention[1]["whole"] == 2 * (attention[0]["split"] + attention[0]["whole"]), (
        "attention's scores counted: SDPA traced as the meta device decomposes it, not as the fused kernel it is"
    )
    assert traced("reads") is None  # a model that reads its data does not run on the meta device: no trace


def test_elementwise_work_is_priced_beyond_the_reference_block_s_share():
    """A rank's traced bytes at the profile's rate for their bytes per op, less its FLOPs at the reference block's
    elementwise seconds per FLOP: a model with the reference's bytes per FLOP costs nothing more; twice its bytes,
    their seconds; under TP the residual stream's tensors stay whole, the rest and the per-call bytes split."""
    ops, nbytes, flops = reference(1, 128)
    entry = {"elementwise_bytes_per_s": {"1000": 1e9, str(10 * nbytes // ops): 1e8}}
    rate = entry["elementwise_bytes_per_s"]
    at_ref = nbytes / ops  # the reference's own bytes per op: the rate between the two measured sizes

    def excess(traced: dict, **kw) -> float:
        return excess_seconds(entry, traced, **{"tokens": 128, "tp": 1, "calls": 1, "share": 1.0, "flops": flops} | kw)

    same = {"tokens": 128, "ops": ops, "whole": nbytes, "split": 0, "fixed": 0}
    assert excess(same) == pytest.approx(0.0, abs=1e-12), "the reference block's own elementwise work priced again"
    assert excess(same | {"whole": 2 * nbytes}) > 0 and excess(same | {"whole": nbytes // 2}) < 0
    seconds = excess(same | {"whole": 2 * nbytes, "ops": 2 * ops})  # twice the bytes, in ops of the same size
    assert 1e-9 * nbytes < seconds < 1e-8 * nbytes, (seconds, at_ref, rate)
    assert excess(same | {"whole": 2 * nbytes}, calls=3, share=0.5, flops=1.5 * flops) == pytest.approx(
        1.5 * excess(same | {"whole": 2 * nbytes})
    ), "a stage's share of the model over its microbatches"
    fewer_ops = excess(same | {"whole": 2 * nbytes, "ops": ops // 5})  # larger ops: the slower rate measured there
    assert fewer_ops > seconds
    # under TP=2 the whole bytes stay, the split and per-call ones halve; the reference at TP=2
    flops2 = reference(2, 128)[2]
    parts = {"tokens": 128, "ops": ops, "whole": 1000, "split": 6000, "fixed": 4000}
    kept = excess(parts, tp=2, flops=0.0)
    assert kept == pytest.approx(excess(parts | {"whole": 1000, "split": 3000, "fixed": 2000}, flops=0.0)), (
        "under TP the residual stream split, or the MLP's tensors kept whole"
    )
    assert excess(parts, tp=2, flops=flops2) < kept  # the TP=2 reference's share taken off
    assert excess_seconds({}, same, tokens=128, tp=1, calls=1, share=1.0, flops=flops) == 0.0  # a profile before it
    assert excess_seconds(entry, None, tokens=128, tp=1, calls=1, share=1.0, flops=flops) == 0.0  # not traced


def test_a_stage_pays_its_share_of_the_model_s_elementwise_work():
    """Through ``predict``: a model with twice the reference's elementwise bytes per FLOP costs its excess, each
    pipeline stage its share by FLOPs; no trace, the FLOPs alone."""
    ops, nbytes, ref_flops = reference(1, 128)
    rank = {"block_flops": {"float32": 1e10}, "block_shapes": {"float32": {"1": {"128": 1.0}}},
            "copy_bytes_per_s": 1e30, "elementwise_bytes_per_s": {"1000": 1e9},
            "send_recv": {"latency_s": 0.0, "bytes_per_s": 1e30}}  # fmt: skip
    profile = {"per_rank": {"1": rank, "2": rank}, "collectives": {}}
    weights = ref_flops / (3 * 128 * 2)  # a model of the reference block's FLOPs on 128 tokens
    traced = {"tokens": 128, "ops": ops, "whole": 2 * nbytes, "split": 0, "fixed": 0}

    def compute(pp: int, elementwise: dict | None) -> list[float]:
        stages = [StageFacts(matmul_weights=int(weights * w), activation_elements=0, attention_layers=0,
                             dense_bytes=0, expert_bytes=0, dense_tensors=1, blocks=1) for w in ((1.0,), (0.75, 0.25))[pp - 1]]  # fmt: skip
        facts = {"seq": 128, "batch": 1, "dtype": "float32", "itemsize": 4, "attention": (1, 1, False),
                 "hidden": 1, "stages": stages, "elementwise": elementwise}  # fmt: skip
        layout = {"dp": 1, "pp": pp, "sp": 1, "tp": 1, "ep": 1, "microbatches": 1, "data_parallel": None}
        return predict(facts, layout, profile, optimizer="none")["stages_s"]

    (flops_only,) = compute(1, None)
    assert flops_only == pytest.approx(ref_flops / 1e10, rel=1e-6)
    (whole,) = compute(1, traced)
    assert whole - flops_only == pytest.approx(nbytes / 1e9, rel=1e-3), "the excess bytes' seconds"
    first, last = compute(2, traced)
    assert first - 0.75 * flops_only == pytest.approx(0.75 * nbytes / 1e9, rel=1e-3), "a stage's share by FLOPs"
    assert last - 0.25 * flops_only == pytest.approx(0.25 * nbytes / 1e9, rel=1e-3)
