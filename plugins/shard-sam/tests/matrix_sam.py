"""The SAM row of ``nox -s matrix`` (benchmarks/matrix.py): a tiny image encoder and mask decoder."""

from sam_cases import batch_for, build

from shardcore.testing import hidden_state_loss

CASES = {
    "sam": {
        "kit": {"zero_grads": ("*.k_proj.bias",)},
        "build": lambda: build(),
        "batch": lambda rows: batch_for(rows=rows),
        "loss_fn": hidden_state_loss("pred_masks", "iou_scores"),
    }
}
