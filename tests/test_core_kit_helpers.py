"""Small parts of the conformance kit: the batch helper and the agreement of rank-local checks."""

from __future__ import annotations

import torch

from shardcore.testing import run_on_ranks, token_batch


def test_token_batch_pads_the_first_row_and_ignores_its_labels():
    batch = token_batch(50, rows=3, seq=8)
    assert batch["input_ids"].shape == (3, 8) and int(batch["input_ids"].max()) < 50
    assert batch["attention_mask"][0, :3].eq(0).all() and batch["attention_mask"][1:].eq(1).all(), (
        "the first row is not left-padded"
    )
    assert batch["labels"][0, :3].eq(-100).all() and torch.equal(batch["labels"][1:], batch["input_ids"][1:])
    assert token_batch(50, pad=False)["attention_mask"].eq(1).all()


def _one_rank_fails() -> str:
    import torch.distributed as dist

    from shardcore.testing.agree import _on_every_rank

    def check() -> float:
        if dist.get_rank() == 1:
            raise AssertionError("rank 1's own slice is wrong")
        return 0.0

    try:
        _on_every_rank(check)
    except AssertionError as err:
        return f"failed: {err}"
    return "passed"


def test_a_rank_local_check_that_fails_on_one_rank_fails_on_every_rank():
    """Else the ranks that passed go on to the next step's collectives and wait for ever."""
    outcomes = run_on_ranks(2, _one_rank_fails)
    assert outcomes[1] == "failed: rank 1's own slice is wrong", outcomes
    assert outcomes[0].startswith("failed: another rank's check"), f"rank 0 went on: {outcomes}"
