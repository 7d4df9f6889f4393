"""Dropout under tensor parallelism: attention dropout draws per rank, residual dropout stays in
step across ranks, and training with dropout is statistically the unsharded model."""

from __future__ import annotations

import torch
from bert_cases import batch_for, build

import shardcore
from shardcore import ShardConfig
from shardcore.testing import run_on_ranks


def _replicas_in_step(tp: int) -> bool:
    """With dropout on, every rank computes the same (replicated) hidden states and loss."""
    import torch.distributed as dist

    torch.manual_seed(0)
    model = shardcore.optimize(build("BertForMaskedLM", dropout=0.3), ShardConfig(tensor_parallel_size=tp)).train()
    out = model(**batch_for("BertForMaskedLM"), output_hidden_states=True)
    # every layer's replicated hidden states: the logits alone would not do, they are gathered from
    # every rank's vocabulary slice and so equal on all ranks even when the ranks' states differ
    stats = torch.cat([out.loss.detach().view(1), torch.stack(out.hidden_states).detach().flatten()])
    every = [torch.empty_like(stats) for _ in range(tp)]
    dist.all_gather(every, stats)
    return all(torch.equal(every[0], e) for e in every)


def test_dropout_keeps_replicas_in_step():
    assert all(run_on_ranks(2, _replicas_in_step, 2))


def _attention_masks_differ_per_rank() -> list:
    """The per-rank stream differs between ranks; the default stream is left as it was."""
    from shardcore.tensor_parallel import fork_tp_rng

    torch.manual_seed(0)
    with fork_tp_rng(torch.distributed.group.WORLD):
        tp_draw = torch.rand(4).tolist()
    return [tp_draw, torch.rand(4).tolist()]


def test_per_rank_stream():
    (tp0, default0), (tp1, default1) = run_on_ranks(2, _attention_masks_differ_per_rank)
    assert tp0 != tp1, "ranks must drop different heads"
    assert default0 == default1, "the replicated stream must stay in step"
    torch.manual_seed(0)
    assert default0 == torch.rand(4).tolist(), "forking must not consume the default stream"


def _attention_draws_from_per_rank_stream(tp: int) -> bool:
    """A training forward moves this rank's tensor-parallel stream on: attention dropout draws from it."""
    from shardcore.tensor_parallel import fork_tp_rng

    torch.manual_seed(0)
    model = shardcore.optimize(build("BertForMaskedLM", dropout=0.3), ShardConfig(tensor_parallel_size=tp)).train()
    group = model.shardcore.process_group
    with fork_tp_rng(group):
        before = torch.get_rng_state()
    model(**batch_for("BertForMaskedLM"))
    with fork_tp_rng(group):
        after = torch.get_rng_state()
    return not torch.equal(before, after)


def test_attention_dropout_uses_the_per_rank_stream():
    moved = run_on_ranks(2, _attention_draws_from_per_rank_stream, 2)
    assert all(moved), f"a training forward left the tensor-parallel random stream where it was: {moved}"


def _mean_losses(tp: int, samples: int) -> tuple:
    """Losses of the unsharded and sharded model in training mode, over ``samples`` dropout draws."""
    torch.manual_seed(0)
    ref = build("BertForMaskedLM", dropout=0.3).train()
    torch.manual_seed(0)
    model = shardcore.optimize(build("BertForMaskedLM", dropout=0.3), ShardConfig(tensor_parallel_size=tp)).train()
    batch = batch_for("BertForMaskedLM")
    ref_losses, losses = [], []
    with torch.no_grad():
        for i in range(samples):
            torch.manual_seed(1000 + i)
            ref_losses.append(ref(**batch).loss.item())
            torch.manual_seed(1000 + i)
            losses.append(model(**batch).loss.item())
    return ref_losses, losses


def test_dropout_training_is_statistically_unsharded():
    per_rank = run_on_ranks(2, _mean_losses, 2, 200)
    # every rank computes the same loss for each draw: the replicated activations' dropout (on the
    # shared stream) keeps the ranks in step, the per-rank stream only drops each rank's own heads
    assert per_rank[0][1] == per_rank[1][1]
    ref, got = torch.tensor(per_rank[0])
    # the sharded model draws other masks than the unsharded one, but not in distribution: means
    # agree within 4 standard errors, spreads within 25 %
    se = (ref.var() / len(ref) + got.var() / len(got)).sqrt()
    assert (ref.mean() - got.mean()).abs() < 4 * se, (ref.mean(), got.mean(), se)
    assert 0.75 < got.std() / ref.std() < 1.25, (ref.std(), got.std())


def _checkpointed(attention_dropout: float, reentrant: bool, own: bool = False):
    """The largest gradient difference of a TP=2 MLM step with and without gradient checkpointing,
    or the error: HuggingFace's checkpointing (``own=False``), or the first layer's forward put
    into a ``torch.utils.checkpoint`` of the user's own, which shardcore does not see."""
    from torch.utils.checkpoint import checkpoint
    from transformers import BertConfig, BertForMaskedLM

    from shardcore.tensor_parallel import rng

    def step(checkpointing: bool):
        rng.reset_streams()  # the same per-rank streams for both
        torch.manual_seed(0)
        cfg = BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, attention_probs_dropout_prob=attention_dropout)  # fmt: skip
        model = BertForMaskedLM(cfg)
        if checkpointing and not own:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        model = shardcore.optimize(model, ShardConfig(tensor_parallel_size=2)).train()
        if checkpointing and own:
            layer = model.bert.encoder.layer[0]
            forward = layer.forward
            layer.forward = lambda *a, **k: checkpoint(forward, *a, use_reentrant=False, **k)
        ids = torch.randint(0, 128, (2, 16))
        torch.manual_seed(1)
        model(input_ids=ids, labels=ids).loss.backward()
        return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    plain = step(False)
    try:
        checkpointed = step(True)
    except RuntimeError as err:
        return str(err)
    return max((plain[n] - checkpointed[n]).abs().max().item() for n in plain)


def test_gradient_checkpointing_is_exact():
    """HuggingFace's gradient checkpointing (either mode) recomputes each block with the dropout
    masks of its forward, the per-rank ones included: the gradients are those of the step without it."""
    for reentrant in (False, True):
        for dropout in (0.5, 0.0):
            diff = run_on_ranks(2, _checkpointed, dropout, reentrant)
            assert diff == [0.0, 0.0], (
                f"checkpointed gradients off by {diff} (reentrant={reentrant}, dropout={dropout})"
            )


def test_a_checkpoint_shardcore_does_not_see_is_refused():
    """A checkpoint of the user's own would recompute per-rank dropout with other masks than its
    forward drew: refused, by name, on every rank; without attention dropout it is exact."""
    for out in run_on_ranks(2, _checkpointed, 0.5, False, True):
        assert isinstance(out, str) and "recomputed by gradient (activation) checkpointing" in out, (
            f"a checkpoint shardcore does not see ran unrefused (gradients off by {out})"
        )
    assert run_on_ranks(2, _checkpointed, 0.0, False, True) == [0.0, 0.0]
