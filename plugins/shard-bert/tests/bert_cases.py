"""Tiny BERT / RoBERTa models and batches for shard-bert's tests (random weights, fp32)."""

from __future__ import annotations

import torch

VOCAB = 1001  # not divisible by 2 or 4, like BERT's 30522 is not by 4: padding must be invisible
SEQ = 10
BATCH = 2


def build(
    cls_name: str,
    *,
    heads: int = 4,
    hidden: int = 64,
    intermediate: int = 128,
    layers: int = 2,
    dropout: float = 0.0,
    **extra,
):
    import transformers

    family = "roberta" if cls_name.startswith("Roberta") else "bert"
    config_cls = transformers.RobertaConfig if family == "roberta" else transformers.BertConfig
    config = config_cls(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        max_position_embeddings=64,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        num_labels=2 if cls_name.endswith("QuestionAnswering") else 3,
        # 5x BERT's 0.02: with 0.02 attention is near uniform and the query projection's gradient
        # sits at the fp32 noise floor, where the kit cannot test it
        initializer_range=0.1,
        **extra,
    )
    config._attn_implementation = "sdpa"
    if cls_name == "BertLMHeadModel":
        config.is_decoder = True
    return getattr(transformers, cls_name)(config).float()


def batch_for(cls_name: str, seed: int = 1, hidden: int = 64) -> dict:
    """Inputs (with padding, token types) and the labels ``cls_name`` takes."""
    g = torch.Generator().manual_seed(seed)
    shape = (BATCH, 3, SEQ) if cls_name.endswith("MultipleChoice") else (BATCH, SEQ)
    ids = torch.randint(5, VOCAB, shape, generator=g)
    mask = torch.ones_like(ids)
    mask[0, ..., -3:] = 0  # right padding on the first example
    out = {"input_ids": ids, "attention_mask": mask}
    if not cls_name.startswith("Roberta"):
        out["token_type_ids"] = torch.randint(0, 2, shape, generator=g)
    tokens = lambda: torch.where(torch.rand(shape, generator=g) < 0.3, ids, torch.full_like(ids, -100))  # noqa: E731
    if cls_name.endswith(("MaskedLM", "LMHeadModel")):
        out["labels"] = tokens()
    elif cls_name.endswith("ForPreTraining"):
        out["labels"] = tokens()
        out["next_sentence_label"] = torch.tensor([0, 1])
    elif cls_name.endswith(("SequenceClassification", "MultipleChoice")):
        out["labels"] = torch.tensor([2, 0]) if not cls_name.endswith("MultipleChoice") else torch.tensor([1, 2])
    elif cls_name.endswith("NextSentencePrediction"):
        out["labels"] = torch.tensor([1, 0])
    elif cls_name.endswith("TokenClassification"):
        out["labels"] = torch.randint(0, 3, shape, generator=g)
    elif cls_name.endswith("QuestionAnswering"):
        out["start_positions"], out["end_positions"] = torch.tensor([1, 3]), torch.tensor([4, 6])
    if cls_name == "BertLMHeadModel":
        out["encoder_hidden_states"] = torch.randn(BATCH, 7, hidden, generator=g)
    return out
