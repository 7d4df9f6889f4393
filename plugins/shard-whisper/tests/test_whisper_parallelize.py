"""shardcore.parallelize from this (plain, non-torchrun) process: Whisper at world_size 2, from a
save_pretrained directory and from the in-memory module, against the unsharded model."""

from __future__ import annotations

import pytest
import torch
from whisper_cases import build_for_generation, input_features

import shardcore
from shardcore.testing import assert_generate_matches

GEN = {"max_new_tokens": 20, "do_sample": False, "use_cache": True}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    torch.manual_seed(0)
    model = build_for_generation().eval()
    path = tmp_path_factory.mktemp("whisper")
    model.save_pretrained(path)
    return model, path


@pytest.mark.parametrize("source", ["path", "module"])
def test_forward_and_generate_match_unsharded(reference, source):
    model, path = reference
    features = input_features()
    decoder = torch.tensor([[model.config.decoder_start_token_id, 5, 9, 11]] * 2)
    with shardcore.parallelize(path if source == "path" else model, world_size=2) as handle:
        out = handle(input_features=features, decoder_input_ids=decoder)
        with torch.no_grad():
            want = model(input_features=features, decoder_input_ids=decoder)
        assert type(out) is type(want)
        for field in ("logits", "encoder_last_hidden_state"):
            # 1e-5 relative to the largest value: std-0.5 weights (see build_for_generation) give
            # logits in the hundreds, where split matmuls' other summation order moves a few ulps
            bound = 1e-5 * max(1.0, want[field].abs().max().item())
            diff = (out[field] - want[field]).abs().max().item()
            assert diff <= bound, f"{field}: max abs diff {diff:.3g} > {bound:.3g}"
        for beams in (1, 4):  # greedy and beam search: the same tokens, step by step the same scores
            tokens = assert_generate_matches(model, handle, features, num_beams=beams, **GEN)
            assert tokens.shape[1] >= 20
