"""Megatron's sequence split (split_gather) as the core runs it, on a tiny Llama (2 gloo ranks): which
collectives a step issues, and whether the overlap prefetches the gathers of the saved inputs. The
numbers against the unsharded model are the plugins' tests (shard-llama's test_llama_sequence.py)."""

from __future__ import annotations

import torch

from shardcore import ShardConfig
from shardcore.tensor_parallel import count_collectives
from shardcore.testing import run_on_ranks, token_batch

SP = {"enable_sequence_parallelism": True, "sequence_parallelism_mode": "split_gather"}


def build(cls_name: str = "LlamaForCausalLM"):
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=128, attention_dropout=0.0, pad_token_id=0,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    return getattr(transformers, cls_name)(config).float()


def lm_batch(seq: int) -> dict:
    """Token ids with left padding on the first row (masked, labels ignored), labels = ids."""
    return token_batch(128, 2, seq, seed=1, pad=True)


def _counts(seq: int, overlap: bool = False) -> dict:
    import shardcore
    from shardcore.distributed.collectives import Pending
    from shardcore.sequence.split_gather import _Regather

    torch.manual_seed(0)
    config = ShardConfig(tensor_parallel_size=2, enable_sequence_overlap=overlap, **SP)
    model = shardcore.optimize(build("LlamaForCausalLM"), config)
    batch = lm_batch(seq=seq)
    with count_collectives() as forward:
        out = model(**batch)
    gets, get = [], _Regather.get

    def spy(self):  # was the gather of this saved input started before the backward needed it?
        gets.append(isinstance(self.full, Pending))
        return get(self)

    _Regather.get = spy
    try:
        with count_collectives() as backward:
            out.loss.backward()
    finally:
        _Regather.get = get
    return {"forward": dict(forward), "backward": dict(backward), "prefetched": gets}


def test_the_sequence_is_split_and_an_odd_length_runs_unsplit():
    split, odd = run_on_ranks(2, _counts, 12)[0], run_on_ranks(2, _counts, 11)[0]
    # 2 blocks x (attention, MLP): 4 reduce-scatters forward; the gathers of their inputs, the
    # split before the first block and the gather after the last, the full logits
    assert split["forward"].get("reduce_scatter") == 4, f"not every block's two regions ran sequence-split: {split}"
    assert split["backward"].get("reduce_scatter") == 4, split  # the gathered inputs' gradients
    assert odd["forward"].get("reduce_scatter") is None and odd["forward"]["all_reduce"] >= 4, odd
    assert split["prefetched"] and not any(split["prefetched"]), split  # each gathered when reached


def test_overlap_cuts_the_reduce_scatters_and_prefetches_the_saved_inputs():
    plain, overlap = run_on_ranks(2, _counts, 12)[0], run_on_ranks(2, _counts, 12, True)[0]
    # each row-parallel layer's output in 2 chunks, each reduce-scattered as soon as its matmul ends
    assert overlap["forward"].pop("reduce_scatter") == 2 * plain["forward"].pop("reduce_scatter") == 8
    assert overlap["forward"] == plain["forward"] and overlap["backward"] == plain["backward"]  # no other traffic
    # the 4 gathered inputs (attention's and the MLP's, 2 blocks), each read by 2-3 projections in the
    # backward: the first read finds the gather already started by the row-parallel layer after it
    assert overlap["prefetched"].count(True) == 4 and len(overlap["prefetched"]) == len(plain["prefetched"]), overlap
