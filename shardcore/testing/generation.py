"""Generation check: a sharded model's ``generate()`` against the unsharded one, on inputs that can fail."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .tolerance import SCORES, within

__all__ = ["assert_generate_matches", "assert_generate_through_stages"]


def assert_generate_matches(
    ref: nn.Module, model: nn.Module, *args, min_distinct: int = 4, rtol_scores: float = SCORES.rtol, **kwargs
) -> torch.Tensor:
    """``model.generate(*args, **kwargs)`` must give ``ref``'s tokens and, step by step, its scores
    (within ``rtol_scores`` times the step's largest score magnitude, at least 1: :mod:`.tolerance`); returns
    the sequences. Run on every rank.

    The test input must make the check able to fail: in every row the unsharded model's new
    tokens take at least ``min_distinct`` values, and different rows get different tokens (a
    random tiny model that emits one token whatever its input would hide an encoder or attention error).
    """
    kwargs.update(output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        want, got = ref.generate(*args, **kwargs), model.generate(*args, **kwargs)
    if not torch.equal(got.sequences, want.sequences):
        raise AssertionError(f"sharded tokens {got.sequences.tolist()} != unsharded {want.sequences.tolist()}")
    new = want.sequences[:, -len(want.scores) :]
    for row in new.tolist():
        if len(set(row)) < min_distinct:
            raise AssertionError(f"the unsharded model's tokens barely vary ({row}): a test input that cannot fail")
    if new.shape[0] > 1 and all(torch.equal(new[0], r) for r in new[1:]):
        raise AssertionError(f"every row got the same tokens ({new[0].tolist()}): the input does not matter")
    for step, (a, b) in enumerate(zip(got.scores, want.scores, strict=True)):
        finite = torch.isfinite(b)
        if not torch.equal(finite, torch.isfinite(a)):
            raise AssertionError(f"step {step}: the sharded scores mask other tokens than the unsharded ones")
        if not finite.any():
            continue
        diff = (a[finite] - b[finite]).abs().max().item()
        bound = rtol_scores * max(1.0, b[finite].abs().max().item())  # relative to large (log-)scores
        within("scores", diff, bound, f"step {step}: scores differ by {diff:.3g} > {bound:.3g}")
    return got.sequences


def assert_generate_through_stages(
    make: Callable[[], nn.Module], vocab: int, *, stages: int = 2, rows: int = 2, prompt: int = 6, new_tokens: int = 5
) -> list:
    """Greedy ``generate()`` of ``make()`` cut into ``stages`` pipeline stages by :func:`shardcore.optimize`
    equal to ``make()``'s own, tokens and scores (:func:`assert_generate_matches`, which refuses a
    model whose tokens barely vary); returns the tokens. ``make()`` builds the same weights at each
    call (it seeds). Run on every rank of ``stages``."""
    import shardcore

    ref = make().eval()
    model = shardcore.optimize(make(), shardcore.ShardConfig(pipeline_parallel_size=stages)).eval()
    ids = torch.randint(1, vocab, (rows, prompt), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    return assert_generate_matches(
        ref, model, input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0
    ).tolist()
