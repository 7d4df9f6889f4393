"""BERT in pipeline stages: masked LM (tied decoder, ragged masked tokens) and sequence
classification, alone and with TP; pipeline_step equal to the unsharded model on the whole batch."""

from __future__ import annotations

import pytest
import torch
from bert_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.tensor_parallel import count_collectives
from shardcore.testing import assert_pipeline_matches, run_on_ranks


def _batch(cls_name: str) -> dict:
    # 4 rows from two batches; masked LM: 30% of the tokens labelled, a different count per row
    a, b = batch_for(cls_name, 1), batch_for(cls_name, 2)
    return {k: torch.cat([a[k], b[k]]) for k in a}


def _check(cls_name: str, pp: int, tp: int, schedule: str, layers: int, sp: bool = False) -> dict:
    config = ShardConfig(
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        num_microbatches=4,
        pipeline_schedule=schedule,
        enable_sequence_parallelism=sp,
    )
    with count_collectives() as counts:
        report = assert_pipeline_matches(
            lambda: build(cls_name, layers=layers), _batch(cls_name), config, zero_grads=("*.self.key.bias",)
        )
    report["reduce_scatters"] = counts.get("reduce_scatter", 0)
    return report


@pytest.mark.parametrize(
    ("cls_name", "pp", "tp", "schedule", "layers", "sp"),
    [
        ("BertForMaskedLM", 2, 1, "GPipe", 2, False),
        ("BertForMaskedLM", 2, 1, "1F1B", 2, False),
        ("BertForMaskedLM", 2, 2, "1F1B", 2, False),
        ("BertForSequenceClassification", 2, 1, "1F1B", 2, False),
        ("BertForMaskedLM", 2, 1, "Interleaved1F1B", 4, False),
        # each stage splits the tokens at its first layer and gathers them after its last
        ("BertForSequenceClassification", 2, 2, "1F1B", 2, True),
    ],
    ids=["mlm-gpipe", "mlm-1f1b", "mlm-1f1b-tp2", "seqcls-1f1b", "mlm-interleaved", "seqcls-1f1b-tp2-split_gather"],
)
def test_pipeline_trains_like_unsharded(cls_name, pp, tp, schedule, layers, sp):
    for report in run_on_ranks(pp * tp, _check, cls_name, pp, tp, schedule, layers, sp):
        assert report["loss_rel_diff"] <= 1e-6 and "max_abs_diff_after_steps" in report, report
        assert (report["reduce_scatters"] > 0) == sp, report


def _infer() -> dict:
    import shardcore

    torch.manual_seed(0)
    ref = build("BertForMaskedLM").eval()
    torch.manual_seed(0)
    model = shardcore.optimize(build("BertForMaskedLM"), ShardConfig(pipeline_parallel_size=2)).eval()
    batch = _batch("BertForMaskedLM")
    with torch.no_grad():
        got, want = model(**batch), ref(**batch)
    return {"logits": (got.logits - want.logits).abs().max().item(), "loss": abs(got.loss.item() - want.loss.item())}


def test_forward_through_the_stages():
    for out in run_on_ranks(2, _infer):
        assert out["logits"] <= 1e-5 and out["loss"] <= 1e-6, out
