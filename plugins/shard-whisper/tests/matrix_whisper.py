"""The Whisper row of ``nox -s matrix`` (benchmarks/matrix.py): a tiny speech-to-text model."""

import torch
from whisper_cases import VOCAB, build, input_features


def _batch(rows: int) -> dict:
    ids = torch.randint(4, VOCAB, (rows, 9), generator=torch.Generator().manual_seed(0))
    ids[:, 0] = 3  # decoder start
    return {"input_features": input_features(rows), "decoder_input_ids": ids[:, :-1], "labels": ids[:, 1:]}


CASES = {
    "whisper": {
        "kit": {"zero_grads": ("*.k_proj.bias",)},
        "build": lambda: build("WhisperForConditionalGeneration"),
        "batch": _batch,
    }
}
