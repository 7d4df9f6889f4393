"""The CLIP row of ``nox -s matrix`` (benchmarks/matrix.py): a tiny two-tower model and its contrastive loss."""

from clip_cases import batch_for, build

CASES = {
    "clip": {
        "kit": {"zero_grads": ("*.self_attn.k_proj.bias",)},
        "build": lambda: build("CLIPModel"),
        "batch": lambda rows: {**batch_for("CLIPModel", rows=rows), "return_loss": True},
    }
}
