"""``nox -s matrix``: every installed family against every feature at tiny size, each cell measured
against the unsharded model and set beside what the family declares.

    python benchmarks/matrix.py [--rows ROW ...] [--features FEATURE ...] [--out-dir benchmarks/results]

The rows come from the plugins' folders: each ``plugins/shard-*/tests/matrix_<family>.py`` holds
``CASES = {row: {"build": callable, "batch": callable(rows) -> dict}}`` (a tiny model, random
weights, fp32, dropout 0; a batch of ``rows`` sequences of 16 tokens). The features are
:data:`shardcore.explain.features.FEATURES` (2 gloo ranks; FSDP x TP on 4). Per cell:

* **declared**: :func:`shardcore.explain.features.declared` on the row's model built on the meta device:
  ``optimize``'s own checks on paper (the policy's specs), and the kernel switches by what acts;
* **measured** on real ranks with the conformance kit (``shardcore.testing``): loss, outputs and
  every gradient (gathered) against the unsharded model, and the parameters after 3 AdamW steps;
  pipelines through ``pipeline_step`` (2 stages, 2 microbatches of a batch of 4), FSDP x TP on
  a batch of 4, lazy init from a checkpoint of the same weights. ``exact`` also needs the feature's
  collectives to have run (an all-to-all for Ulysses, a ring shift for the ring, a reduce-scatter for
  Megatron's split): a layout that quietly ran unsplit is ``inactive``. ``refused``: ``optimize``
  refused it (its message kept); ``wrong``: a difference over the kit's bounds; ``error``: anything else.

A cell is **consistent** when a declared feature is exact and a refused one is refused (a kernel switch
with nothing to act on: ``n/a``, it runs and changes nothing).
Writes ``matrix.json`` and ``matrix.md`` (the table the docs show) and exits 1 on any inconsistent cell.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import sys
import tempfile
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: collectives that prove a feature ran (its counts must be > 0)
PROOF = {"sp_ulysses": "all_to_all", "sp_ring": "ring_shift", "sp_split_gather": "reduce_scatter"}
PROOF["sp_overlap"] = "reduce_scatter"
#: the kit's switch (shardcore.testing.SWITCHES) of each kernel feature
SWITCH = {"fused_norm": "norm", "jit_fused": "jit"}
MARK = {"exact": "exact", "refused": "refused", "wrong": "**WRONG**", "error": "**ERROR**", "inactive": "**INACTIVE**"}


def case_files() -> dict[str, pathlib.Path]:
    """``{plugin: its matrix_<family>.py}`` for every plugin folder that has one."""
    return {p.parents[1].name: p for p in sorted(ROOT.glob("plugins/shard-*/tests/matrix_*.py"))}


def load_cases(path: pathlib.Path) -> dict:
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # its *_cases.py helpers
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


def declared_row(case: dict) -> dict[str, str | None]:
    import shardcore
    from shardcore.explain.features import declared

    with shardcore.init_empty():
        model = case["build"]()
    return declared(model)


def save_checkpoint_of(case: dict, directory: str) -> str:
    """The unsharded model's weights (seed 0, as the kit builds it), where the lazy-init cell loads them."""
    import torch

    torch.manual_seed(0)
    model = case["build"]()
    if type(model).__module__.startswith("transformers."):  # HF's own layout (model.safetensors, config.json)
        model.save_pretrained(directory)
    else:
        from safetensors.torch import save_model

        pathlib.Path(directory).mkdir(parents=True, exist_ok=True)
        save_model(model, f"{directory}/model.safetensors")
    return directory


def cell(path: str, row: str, feature: str, checkpoint: str | None) -> dict:
    """One cell on this rank (every rank of the pool runs it): ``{"outcome": ..., ...}``."""
    import shardcore
    from shardcore.explain.features import FEATURES
    from shardcore.tensor_parallel import count_collectives
    from shardcore.testing import (
        assert_data_parallel_matches,
        assert_lazy_load_matches,
        assert_pipeline_matches,
        assert_sharded_matches,
        assert_switch_matches,
    )

    case = load_cases(pathlib.Path(path))[row]
    build, batch = case["build"], case["batch"]
    kit = case.get("kit", {})  # the kit's arguments the family's own tests pass (zero_grads, tolerances)
    loss = {"loss_fn": case["loss_fn"]} if "loss_fn" in case else {}
    config = shardcore.ShardConfig(**FEATURES[feature][0])
    start = time.perf_counter()
    try:
        with count_collectives() as counts:
            if feature == "pp":
                report = assert_pipeline_matches(build, batch(4), config, **kit)
            elif feature == "fsdp":
                report = assert_data_parallel_matches(
                    build, case.get("dp_batch", _whole_rows(batch))(4), config, **loss, **kit
                )
            elif feature == "lazy_init":
                report = {"max_abs_diff_outputs": assert_lazy_load_matches(build, batch(2), checkpoint, config)}
            elif feature in ("fused_norm", "jit_fused"):
                ran = assert_switch_matches(build, batch(2), SWITCH[feature], 2, **loss, **kit)
                report = {}
            else:
                report = assert_sharded_matches(build, batch(2), config, **loss, **kit)
    except AssertionError as err:
        return {"outcome": "wrong", "reason": str(err)[:400]}
    except (shardcore.ShardingCheckError, NotImplementedError, ValueError) as err:
        return {"outcome": "refused", "reason": f"{type(err).__name__}: {str(err).splitlines()[0][:400]}"}
    except Exception as err:
        return {"outcome": "error", "reason": f"{type(err).__name__}: {traceback.format_exc(limit=-3)[-500:]}"}
    proof = PROOF.get(feature)
    if proof and not counts.get(proof):
        return {"outcome": "inactive", "reason": f"no {proof} ran: the feature did not split anything"}
    if feature in ("fused_norm", "jit_fused") and not _acted(ran):
        return {"outcome": "inactive", "reason": f"the switch ran on nothing: {ran}"}
    keep = ("loss_rel_diff", "max_rel_err_grads", "max_abs_diff_outputs", "max_abs_diff_after_steps")
    return {"outcome": "exact", "seconds": round(time.perf_counter() - start, 2)} | {
        k: float(f"{report[k]:.3g}") for k in keep if isinstance(report.get(k), int | float)
    }


def _whole_rows(batch):
    """``batch`` without padding, every token a label: each data-parallel rank's mean loss then weighs
    as the whole batch's (with padding the ranks' means are over different token counts, by design)."""

    def rows(n: int) -> dict:
        b = dict(batch(n))
        ids, labels = b.get("input_ids"), b.get("labels")
        if ids is not None and labels is not None and labels.shape == ids.shape and "attention_mask" in b:
            b["attention_mask"] = b["attention_mask"].new_ones(ids.shape)
            b["labels"] = ids.clone()
        return b

    return rows


def _acted(ran: dict) -> bool:
    """Whether a kernel switch's report (``model.shardcore.kernels``) says it replaced or compiled something."""
    text = " ".join(str(v) for v in ran.values())
    return bool(ran) and not text.startswith(("0 norms", "nothing")) and "nothing to fuse" not in text


def consistent(declared: str | None, outcome: str) -> bool:
    """A declared feature is exact; a refused one refused (by ``optimize``) or, a kernel switch with
    nothing to act on, inactive."""
    return outcome == "exact" if declared is None else outcome in ("refused", "inactive")


def run(rows: dict[str, tuple[pathlib.Path, dict]], features: list[str]) -> list[dict]:
    from shardcore.explain.features import FEATURES
    from shardcore.testing import close_pools, run_on_ranks

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for row, (path, case) in rows.items():
            declared = declared_row(case)
            checkpoint = save_checkpoint_of(case, f"{tmp}/{row}") if "lazy_init" in features else None
            for feature in features:
                start = time.perf_counter()
                world = FEATURES[feature][1]
                measured = run_on_ranks(world, cell, str(path), row, feature, checkpoint)[0]
                if measured["outcome"] in ("wrong", "error", "inactive"):
                    close_pools()  # a rank may have been left inside a collective: fresh ranks for the next cell
                item = {"row": row, "plugin": path.parents[1].name, "feature": feature, "declared": declared[feature]}
                item |= measured | {"consistent": consistent(declared[feature], measured["outcome"])}
                results.append(item)
                flag = "" if item["consistent"] else "   <-- INCONSISTENT with the declaration"
                flag += f"\n    {measured['reason'][:300]}" if measured["outcome"] != "exact" else ""
                print(
                    f"{row:14} {feature:16} {measured['outcome']:9} {time.perf_counter() - start:5.1f}s{flag}",
                    flush=True,
                )
    return results


def table(results: list[dict], version: str) -> str:
    """The markdown table: a row per family, a column per feature; the refusals' reasons below."""
    from shardcore.explain.features import FEATURES

    features = [f for f in FEATURES if any(r["feature"] == f for r in results)]
    rows = list(dict.fromkeys(r["row"] for r in results))
    at = {(r["row"], r["feature"]): r for r in results}
    exact = sum(r["outcome"] == "exact" for r in results)
    bad = sum(not r["consistent"] for r in results)
    lines = [
        f"{exact} of {len(results)} cells exact, {bad} inconsistent with the families' declarations "
        f"(transformers {version}; `nox -s matrix`).",
        "",
        "| family | " + " | ".join(features) + " |",
        "|---|" + "---|" * len(features),
    ]
    notes: dict[str, int] = {}
    for row in rows:
        cells = []
        for f in features:
            r = at.get((row, f))
            if r is None:
                cells.append("-")
                continue
            text = MARK[r["outcome"]] + ("" if r["consistent"] else " (declared otherwise)")
            if r["outcome"] == "inactive" and r["consistent"]:
                text = "n/a"  # a kernel switch with nothing in this family to act on, as declared
            if r["outcome"] != "exact":
                reason = r.get("reason") or ""
                notes.setdefault(reason, len(notes) + 1)
                text += f" [{notes[reason]}]"
            cells.append(text)
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += ["", *(f"{n}. {reason}" for reason, n in notes.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    from shardcore.explain.features import FEATURES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", default=None, help="rows (families) to run; default all")
    parser.add_argument("--features", nargs="*", default=list(FEATURES), choices=list(FEATURES))
    parser.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    rows = {}
    for _, path in case_files().items():
        for row, case in load_cases(path).items():
            if args.rows is None or row in args.rows:
                rows[row] = (path, case)
    sys.path[:0] = [str(p.parent) for p in case_files().values()]  # the workers import the cases' helpers
    os.environ.setdefault("SHARDCORE_COLLECTIVE_TIMEOUT", "60")  # a cell whose ranks part ways ends in a minute
    from shardcore.testing import close_pools

    start = time.perf_counter()
    try:
        results = run(rows, args.features)
    finally:
        close_pools()
    import transformers

    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    partial = args.rows is not None or args.features != list(FEATURES)
    stem = "matrix_partial" if partial else "matrix"
    seconds = round(time.perf_counter() - start, 1)
    record = {"transformers": transformers.__version__, "seconds": seconds, "cells": results}
    (out / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / f"{stem}.md").write_text(table(results, transformers.__version__))
    print(f"\n{table(results, transformers.__version__)}\nwrote {out / stem}.{{json,md}} in {seconds} s")
    return 0 if all(r["consistent"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
