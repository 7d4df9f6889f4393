"""shardcore.parallelize from this (plain, non-torchrun) process: a GQA Llama at world_size 2, from
a save_pretrained directory and from the in-memory module, against the unsharded model."""

from __future__ import annotations

import pytest
import torch
from llama_cases import build, lm_batch

import shardcore
from shardcore.testing import assert_generate_matches, assert_outputs_close

GEN = {"max_new_tokens": 16, "do_sample": False, "use_cache": True, "pad_token_id": 0}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    torch.manual_seed(0)
    model = build("LlamaForCausalLM", kv=2, vocab=1001, initializer_range=0.1).eval()  # 4 heads, 2 KV heads
    path = tmp_path_factory.mktemp("llama")
    model.save_pretrained(path)
    return model, path


@pytest.mark.parametrize("source", ["path", "module"])
def test_forward_and_generate_match_unsharded(reference, source):
    model, path = reference
    batch = lm_batch(1001, seed=3)
    with shardcore.parallelize(path if source == "path" else model, world_size=2) as handle:
        assert handle.config.num_key_value_heads == 2 and handle.config.num_attention_heads == 4
        out = handle(**batch)
        with torch.no_grad():
            want = model(**batch)
        assert type(out) is type(want)
        assert_outputs_close(out.logits, want.logits, "logits through parallelize")  # split matmuls: other sums
        torch.testing.assert_close(out.loss, want.loss, rtol=1e-6, atol=0)
        cache = getattr(out, "cache", getattr(out, "past_key_values", None))  # each worker's: its own KV heads
        assert cache is None, f"parallelize handed back rank 0's cache of its own heads: {type(cache).__name__}"
        for beams in (1, 4):  # greedy and beam search: the same tokens, step by step the same scores
            ids = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            tokens = assert_generate_matches(model, handle, **ids, num_beams=beams, **GEN)
            assert tokens.shape == (2, 12 + 16)
        plain = handle.generate(batch["input_ids"], attention_mask=batch["attention_mask"], **GEN)
        assert torch.equal(plain, model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], **GEN))
        pids = handle.pids
    assert handle.closed and len(pids) == 2


def test_bfloat16_with_tied_embeddings_from_a_path(tmp_path):
    """``dtype=torch.bfloat16``: the parameters in bf16 (tied ones stay tied), buffers kept; the
    tokens of ``from_pretrained(path, dtype=bfloat16)``."""
    import transformers
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    build("LlamaForCausalLM", kv=2, vocab=1001, initializer_range=0.1, tie=True).save_pretrained(tmp_path)
    key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"  # renamed in 5
    ref = LlamaForCausalLM.from_pretrained(tmp_path, **{key: torch.bfloat16}).eval()
    batch = lm_batch(1001, seed=3)
    with shardcore.parallelize(tmp_path, world_size=2, dtype=torch.bfloat16) as handle:
        out = handle(**batch)
        with torch.no_grad():
            want = ref(**batch)
        assert out.logits.dtype == torch.bfloat16
        # bf16 keeps 8 bits of mantissa: a few of its ulps at the logits' scale, summed in another order
        diff = (out.logits.float() - want.logits.float()).abs().max().item()
        assert diff <= 0.03 * want.logits.abs().max().item(), diff
        ids = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        assert torch.equal(handle.generate(**ids, **GEN), ref.generate(**ids, **GEN))
