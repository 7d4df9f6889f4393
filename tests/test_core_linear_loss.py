"""vocab_parallel_linear_cross_entropy: the LM head and its cross entropy chunk by chunk, at TP = 1, 2
and 4 on gloo, equal to F.cross_entropy of the whole logits (loss under each reduction, the gradients
of the hidden states, the weight and the bias), a vocabulary padded to the group, ignored targets, a
chunk that does not divide the tokens; and the logits are never saved for the backward. And the mark a
selective checkpoint sets while it runs (shardcore.selective_checkpoint_context)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shardcore.tensor_parallel import VocabParallelLMHead1D, vocab_parallel_linear_cross_entropy
from shardcore.testing import run_on_ranks

TOKENS, HIDDEN, VOCAB = 23, 16, 101  # 101: padded to 128 over the group


def _saved_shapes(fn) -> tuple[object, list]:
    """``fn()`` and the shapes of the tensors autograd saved for the backward while it ran."""
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, saved


def _check(tp: int, bias: bool) -> dict:
    import torch.distributed as dist

    group = dist.group.WORLD if tp > 1 else None
    torch.manual_seed(0)
    linear = nn.Linear(HIDDEN, VOCAB, bias=bias)
    hidden = torch.randn(TOKENS, HIDDEN, requires_grad=True)
    target = torch.randint(0, VOCAB, (TOKENS,))
    target[::5] = -100
    want = F.cross_entropy(linear(hidden), target)
    want.backward()
    ref = {"hidden": hidden.grad.clone(), "weight": linear.weight.grad.clone()}
    if bias:
        ref["bias"] = linear.bias.grad.clone()
    head = VocabParallelLMHead1D.from_native_module(linear, group, make_vocab_size_divisible_by=8) if tp > 1 else linear
    head.zero_grad()
    x = hidden.detach().clone().requires_grad_()
    loss, saved = _saved_shapes(lambda: vocab_parallel_linear_cross_entropy(x, head, target, chunk_tokens=5))
    loss.backward()
    out = {"loss": abs(loss.item() - want.item()), "hidden": (x.grad - ref["hidden"]).abs().max().item()}
    n = getattr(head, "vocab_end", VOCAB) - getattr(head, "vocab_start", 0)
    start = getattr(head, "vocab_start", 0)
    out["weight"] = (head.weight.grad[:n] - ref["weight"][start : start + n]).abs().max().item()
    out["padding_grad"] = head.weight.grad[n:].abs().max().item() if head.weight.shape[0] > n else 0.0
    if bias:
        out["bias"] = (head.bias.grad[:n] - ref["bias"][start : start + n]).abs().max().item()
    # no logits kept, of any chunk: nothing saved is [tokens, vocabulary slice] (the plain loss keeps them whole)
    out["saved_logits"] = [shape for shape in saved if len(shape) == 2 and shape[-1] in (n, head.weight.shape[0])]
    _, plain_saved = _saved_shapes(lambda: F.cross_entropy(linear(hidden), target))
    out["plain_saves_logits"] = (TOKENS, VOCAB) in plain_saved
    for reduction in ("sum", "none"):
        got = vocab_parallel_linear_cross_entropy(hidden.detach(), head, target, chunk_tokens=7, reduction=reduction)
        plain = F.cross_entropy(linear(hidden.detach()), target, reduction=reduction)
        out[reduction] = ((got - plain).abs() / plain.abs().clamp(min=1)).max().item()  # relative: a sum of 23
    return out


@pytest.mark.parametrize(("tp", "bias"), [(1, False), (2, True), (4, False)], ids=["tp1", "tp2-bias", "tp4"])
def test_equals_the_whole_logits_cross_entropy(tp, bias):
    for out in run_on_ranks(tp, _check, tp, bias):
        errors = {k: out[k] for k in ("loss", "hidden", "weight", "sum", "none", *(("bias",) if bias else ()))}
        assert max(errors.values()) <= 1e-5, f"differs from the whole logits' cross entropy: {errors}"
        assert out["padding_grad"] == 0.0, out
        assert out["plain_saves_logits"] and not out["saved_logits"], out


def test_bad_shapes_refused():
    head = nn.Linear(4, 7)
    with pytest.raises(ValueError, match=r"hidden \[tokens, hidden\] and target \[tokens\]"):
        vocab_parallel_linear_cross_entropy(torch.randn(2, 3, 4), head, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk_tokens must be at least 1"):
        vocab_parallel_linear_cross_entropy(torch.randn(3, 4), head, torch.zeros(3, dtype=torch.long), chunk_tokens=0)


def test_a_selective_checkpoint_marks_its_forward_and_recompute():
    """While a selective checkpoint's forward or recompute runs, ``selective_active()`` says so (the
    row-parallel reductions then sum into a copy); outside it, not."""
    from torch.utils.checkpoint import checkpoint

    import shardcore
    from shardcore.tensor_parallel.selective import selective_active

    seen = []

    def block(x):
        seen.append(selective_active())
        return (x @ x.t()).relu().sum()

    x = torch.randn(4, 4, requires_grad=True)
    checkpoint(block, x, use_reentrant=False, context_fn=shardcore.selective_checkpoint_context()).backward()
    assert seen == [True, True], f"selective_active() in the forward and the recompute: {seen}"
    assert not selective_active()
