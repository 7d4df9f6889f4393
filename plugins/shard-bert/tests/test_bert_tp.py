"""Every BERT / RoBERTa class sharded against the unsharded model, on real gloo ranks."""

from __future__ import annotations

import pytest
import torch
from bert_cases import batch_for, build

from shardcore import ShardConfig
from shardcore.testing import assert_sharded_matches, hidden_state_loss, run_on_ranks

CLASSES = [
    "BertModel",
    "BertForPreTraining",
    "BertForMaskedLM",
    "BertLMHeadModel",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
    "BertForMultipleChoice",
    "BertForNextSentencePrediction",
    "RobertaModel",
    "RobertaForMaskedLM",
    "RobertaForSequenceClassification",
]


def _zero_grads(cls_name: str) -> tuple[str, ...]:
    """Parameters whose gradient is zero in exact arithmetic (fp32 noise in practice)."""
    zero = ("*.self.key.bias",)  # softmax ignores a shift of every key
    if cls_name.endswith("QuestionAnswering"):
        # the last output bias and qa_outputs.bias shift every position's start/end logit alike: the softmax over positions ignores it
        zero += ("*.encoder.layer.1.output.LayerNorm.bias", "qa_outputs.bias")
    if cls_name.endswith("MultipleChoice"):
        zero += ("classifier.bias",)  # one score per choice, all shifted alike: the softmax over choices ignores it
    return zero


def _check(tp: int, cls_name: str, **cfg) -> dict:
    kwargs = (
        {"loss_fn": hidden_state_loss("last_hidden_state", "pooler_output")}
        if cls_name.endswith("Model") and cls_name != "BertLMHeadModel"
        else {}
    )
    batch = batch_for(cls_name)
    if not cfg.get("add_cross_attention"):
        batch.pop("encoder_hidden_states", None)
    return assert_sharded_matches(
        lambda: build(cls_name, **cfg),
        batch,
        ShardConfig(tensor_parallel_size=tp),
        zero_grads=_zero_grads(cls_name),
        **kwargs,
    )


@pytest.mark.parametrize("tp", [2, 4])  # TP=1 returns the model itself: tested once, in the core
@pytest.mark.parametrize("cls_name", CLASSES)
def test_bert_classes(tp, cls_name):
    run_on_ranks(tp, _check, tp, cls_name)


@pytest.mark.parametrize("tp", [2, 4])
def test_decoder_with_cross_attention(tp):
    run_on_ranks(tp, _check, tp, "BertLMHeadModel", add_cross_attention=True)


def _tied(tp: int) -> bool:
    import shardcore

    torch.manual_seed(0)
    model = shardcore.optimize(build("BertForMaskedLM"), ShardConfig(tensor_parallel_size=tp))
    head = model.cls.predictions
    return (
        head.decoder.weight is model.bert.embeddings.word_embeddings.weight
        and head.bias is head.decoder.bias
        and head.decoder.weight.shape[0] == 1024 // tp  # 1001 padded to a multiple of 64 x tp
    )


@pytest.mark.parametrize("tp", [2, 4])
def test_mlm_decoder_stays_tied(tp):
    assert all(run_on_ranks(tp, _tied, tp))
