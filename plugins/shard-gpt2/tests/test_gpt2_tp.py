"""Sharded GPT-2 against the unsharded model, on real gloo ranks."""

from __future__ import annotations

import pytest
import torch
from gpt2_cases import VOCAB, batch_for, build

import shardcore
from shardcore import ShardConfig
from shardcore.tensor_parallel import FusedConv1D_Col, count_collectives
from shardcore.testing import (
    assert_generate_matches,
    assert_sharded_matches,
    hidden_state_loss,
    refusal_message,
    run_on_ranks,
)

CLASSES = ["GPT2LMHeadModel", "GPT2Model", "GPT2ForSequenceClassification"]


def _check(tp: int, cls_name: str, **cfg) -> dict:
    kwargs = {"loss_fn": hidden_state_loss("last_hidden_state")} if cls_name == "GPT2Model" else {}
    return assert_sharded_matches(
        lambda: build(cls_name, **cfg), batch_for(cls_name), ShardConfig(tensor_parallel_size=tp), **kwargs
    )


@pytest.mark.parametrize("tp", [2, 4])  # TP=1 returns the model itself: tested once, in the core
@pytest.mark.parametrize("cls_name", CLASSES)
def test_matches_unsharded(tp, cls_name):
    run_on_ranks(tp, _check, tp, cls_name)


def test_untied_head_and_eight_heads_at_tp4():
    run_on_ranks(4, _check, 4, "GPT2LMHeadModel", heads=8, tie_word_embeddings=False)


def _layout(tp: int) -> dict:
    torch.manual_seed(0)
    ref = build()
    torch.manual_seed(0)
    model = shardcore.optimize(build(), ShardConfig(tensor_parallel_size=tp))
    attn = model.transformer.h[0].attn
    rank, local = attn.c_attn.tp_rank, 64 // tp
    full = ref.transformer.h[0].attn.c_attn.weight.detach()  # [in, 3 * embd]: q | k | v columns
    expected = torch.cat([full[:, part * 64 + rank * local : part * 64 + (rank + 1) * local] for part in range(3)], 1)
    return {
        "fused": isinstance(attn.c_attn, FusedConv1D_Col),
        "c_attn_is_per_head": torch.equal(attn.c_attn.weight.detach(), expected),
        "c_proj_rows": tuple(attn.c_proj.weight.shape),
        "tied": model.lm_head.weight is model.transformer.wte.weight,
        "full_shapes": {n: tuple(t.shape) for n, t in shardcore.full_named_tensors(model)},
        "ref_shapes": {n: tuple(p.shape) for n, p in ref.named_parameters()},
    }


def test_conv1d_weights_keep_in_out_layout_split_per_head():
    for out in run_on_ranks(2, _layout, 2):
        assert out["fused"] and out["c_attn_is_per_head"] and out["tied"]
        assert out["c_proj_rows"] == (32, 64)  # [in / tp, out]: row parallel splits the input rows
        assert out["full_shapes"] == out["ref_shapes"]  # native names, [in, out] shapes


def _count(tp: int, layers: int) -> dict:
    torch.manual_seed(0)
    model = shardcore.optimize(build(layers=layers), ShardConfig(tensor_parallel_size=tp))
    with count_collectives() as fwd:
        out = model(**batch_for("GPT2LMHeadModel"))
    with count_collectives() as bwd:
        out.loss.backward()
    return {"forward": dict(fwd), "backward": dict(bwd)}


@pytest.mark.parametrize("layers", [1, 3])
def test_collectives_per_step(layers):
    """Forward: one all-reduce after attention and one after the MLP per layer, one for the
    embedding, one all-gather of the logits and one of the loss's per-token statistics (the loss
    is computed on the vocabulary slices). Backward: one all-reduce per column-parallel entry
    (c_attn, c_fc per layer; the LM head)."""
    for counts in run_on_ranks(2, _count, 2, layers):
        # + one all-gather of 16 bytes: the input check (ShardConfig.check_inputs, on by default)
        assert counts["forward"] == {"all_reduce": 2 * layers + 1, "all_gather": 3}
        assert counts["backward"] == {"all_reduce": 2 * layers + 1}


def _generate(tp: int, num_beams: int) -> list:
    torch.manual_seed(0)
    ref = build().eval()
    torch.manual_seed(0)
    model = shardcore.optimize(build().eval(), ShardConfig(tensor_parallel_size=tp))
    batch = batch_for("GPT2LMHeadModel", seed=5, seq=6)
    ids = batch["input_ids"][:, :5]  # no padding: two different prompts
    args = {"max_new_tokens": 12, "do_sample": False, "num_beams": num_beams, "pad_token_id": 0}
    return assert_generate_matches(ref, model, input_ids=ids, **args).tolist()


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam4"])
def test_generate_equal_to_unsharded(num_beams):
    tokens = run_on_ranks(2, _generate, 2, num_beams)
    assert tokens[0] == tokens[1]


def _dropout_replicas(tp: int) -> list:
    import torch.distributed as dist

    torch.manual_seed(0)
    model = shardcore.optimize(build(dropout=0.3).train(), ShardConfig(tensor_parallel_size=tp))
    # the replicated hidden states of every layer (logits would not do: they are gathered from
    # every rank's vocabulary slice, equal on all ranks even when the ranks' states differ)
    hidden = torch.stack(model(**batch_for("GPT2LMHeadModel"), output_hidden_states=True).hidden_states).detach()
    gathered = [torch.empty_like(hidden) for _ in range(tp)]
    dist.all_gather(gathered, hidden)
    return [torch.equal(g, gathered[0]) for g in gathered]


def test_dropout_keeps_replicas_in_step():
    """Attention dropout runs on the per-rank stream, the residual dropout inside the attention
    module on the shared one: the replicated outputs stay bit-identical on every rank."""
    for same in run_on_ranks(2, _dropout_replicas, 2):
        assert all(same), f"the replicated hidden states differ between ranks (equal to rank 0's: {same})"


def _refused(tp: int, **cfg) -> str:
    return refusal_message(lambda: build(**cfg), ShardConfig(tensor_parallel_size=tp))


@pytest.mark.parametrize(
    ("world", "cfg", "expected"),
    [
        (4, {"heads": 6, "embd": 48}, "GPT2LMHeadModel: n_head=6 is not divisible by tensor_parallel_size=4"),
        (2, {"n_inner": 129}, "n_inner (4 x n_embd by default)=129 is not divisible by tensor_parallel_size=2"),
        (2, {"add_cross_attention": True}, "add_cross_attention=True"),
    ],
)
def test_bad_input_refused_on_every_rank(world, cfg, expected):
    messages = run_on_ranks(world, _refused, world, **cfg)
    assert all(expected in m for m in messages), messages


def test_vocab_is_padded_invisibly():
    assert VOCAB % 2 and VOCAB % 4  # the cases above exercise padding at TP=2 and TP=4
