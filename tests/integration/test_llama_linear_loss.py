"""A sharded Llama's loss without its logits (shardcore.vocab_parallel_linear_cross_entropy on the
base model's output and the vocabulary-parallel head), at TP=2 with a padded vocabulary (1001) and
tied embeddings: the loss and every gradient equal to the model's own loss on the whole logits."""

from __future__ import annotations

import pytest
import torch
from llama_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.testing import run_on_ranks


def _loss(model, batch):
    import shardcore

    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    # --8<-- [start:snippet]
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state  # a causal LM's base model
    loss = shardcore.vocab_parallel_linear_cross_entropy(
        hidden[:, :-1].flatten(0, 1), model.lm_head, labels[:, 1:].flatten(), chunk_tokens=1024
    )
    # --8<-- [end:snippet]
    return loss


def _check(tie: bool) -> dict:
    import shardcore

    torch.manual_seed(0)
    model = shardcore.optimize(build("LlamaForCausalLM", vocab=1001, tie=tie), ShardConfig(tensor_parallel_size=2))
    batch = lm_batch(vocab=1001, batch=2, seq=12)
    want = model(**batch).loss
    want.backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    got = _loss(model, batch)
    got.backward()
    grads = max((p.grad - ref[n]).abs().max().item() for n, p in model.named_parameters())
    return {"loss": abs(got.item() - want.item()), "grads": grads}


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_loss_without_the_logits_equals_the_model_s_own(tie):
    for out in run_on_ranks(2, _check, tie):
        assert out["loss"] <= 1e-5 and out["grads"] <= 1e-5, out
