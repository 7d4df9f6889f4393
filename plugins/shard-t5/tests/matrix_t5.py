"""The T5 row of ``nox -s matrix`` (benchmarks/matrix.py): a tiny encoder-decoder, 2 + 2 layers; 8 source
tokens (the sequence splits over 2 ranks)."""

from t5_cases import batch_for, build


def _dp_batch(rows: int) -> dict:
    """No padding and every target a label: each data-parallel rank's mean loss weighs as the whole batch's."""
    b = batch_for("T5ForConditionalGeneration", rows=rows, source=8)
    b["attention_mask"] = b["attention_mask"].new_ones(b["input_ids"].shape)
    b["input_ids"] = b["input_ids"].clamp(min=2)
    b["labels"] = b["labels"].clamp(min=2)
    return b


CASES = {
    "t5": {
        "build": lambda: build(),
        "batch": lambda rows: batch_for("T5ForConditionalGeneration", rows=rows, source=8),
        "dp_batch": _dp_batch,
    }
}
