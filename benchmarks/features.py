"""The per-feature sweep of the zero-config families: every causal-LM family of the installed transformers
that no plugin covers and whose config ships a plan (``ShippedPlanPolicy``), at tiny size, each feature
against the unsharded model on 2 gloo ranks:

* ``pp``: ``pipeline_parallel_size=2`` (1F1B) through ``pipeline_step`` (the stages cut where the
  config's ``base_model_pp_plan`` says; :func:`shardcore.testing.pipeline.assert_pipeline_matches`);
* ``ulysses`` / ``ring``: ``sequence_parallel_size=2`` in ``all_to_all`` / ``ring_attn``, the model built
  with ``attn_implementation="sdpa"`` where it has it (:func:`shardcore.testing.assert_sharded_matches`);
* ``split_gather``: Megatron's, ``tensor_parallel_size=2`` with the sequence split over it (the region
  the TP plan gives);
* ``fsdp``: ``data_parallel="fsdp"`` over the 2 ranks, one row of the batch each
  (:func:`shardcore.testing.assert_data_parallel_matches`: the loss of the whole batch, every gradient);
* ``ep``: ``expert_parallel_size=2`` over DDP, for a mixture-of-experts family (a config with more
  than one routed expert); ``n/a`` for a dense one.

    python benchmarks/features.py [--only TYPE ...] [--features pp ulysses ring split_gather fsdp ep] [--out PATH] [--merge]

``--merge`` keeps the cells of the features not run from the file already at ``--out``.

Each cell is ``exact`` (loss, outputs, every gradient and 3 AdamW steps within the kit's tolerances),
``refused`` (``optimize`` said no, by name, before any collective), ``wrong`` (the kit found a
difference: the outcome the sweep exists to keep at zero), ``inconclusive`` (a gradient the tiny model
leaves at the fp32 noise floor, which the kit refuses to compare), ``error`` (anything else raised) or
``cannot build`` (the family does not build or run unsharded at this size). Families a plugin covers,
and those shipping no plan, are not swept here (``nox -s families``, ``nox -s matrix``).

Writes ``benchmarks/results/features.json`` and ``features.md`` (the totals per feature and every cell).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
FEATURES = ("pp", "ulysses", "ring", "split_gather", "fsdp", "ep")
_SP = {"ulysses": "all_to_all", "ring": "ring_attn", "split_gather": "split_gather"}


def _build(model_type: str, class_name: str, feature: str):
    import torch
    import transformers
    from families import tiny_config

    config = tiny_config(model_type)
    cls = getattr(transformers, class_name)
    if feature in _SP and getattr(cls, "_supports_sdpa", False):
        config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return cls(config).float()


def _batch(model, seq: int) -> dict:
    import torch

    vocab = getattr(model.config, "vocab_size", None) or 512
    ids = torch.randint(3, min(vocab, 512), (2, seq), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids.clone()}


def _experts(config) -> int:
    """How many routed experts the config has (0: a dense model), under the names the MoE configs use."""
    names = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")
    text = getattr(config, "get_text_config", lambda **_: config)()
    return max([0] + [n for n in (getattr(text, k, None) for k in names) if isinstance(n, int) and n > 1])


def one_cell(model_type: str, class_name: str, feature: str) -> dict:
    """One family under one feature on this rank (every rank of the pool calls it)."""
    import shardcore
    from shardcore.testing import assert_sharded_matches
    from shardcore.testing.pipeline import assert_pipeline_matches

    start = time.perf_counter()

    def done(outcome: str, reason: str = "") -> dict:
        return {"outcome": outcome, "reason": reason[:300], "seconds": round(time.perf_counter() - start, 2)}

    try:
        model = _build(model_type, class_name, feature)
        batch = _batch(model, 16)
        model(**batch)
        if type(shardcore.resolve_policy(model)).__name__ != "ShippedPlanPolicy":
            return done("not swept", f"sharded by {type(shardcore.resolve_policy(model)).__name__}")
    except shardcore.NoPolicyError as err:
        return done("not swept", f"no plan: {str(err)[:120]}")
    except Exception as err:
        return done("cannot build", f"{type(err).__name__}: {err}")
    make = functools.partial(_build, model_type, class_name, feature)
    if feature == "ep" and not _experts(model.config):
        return done("n/a", "a dense model: no experts")
    try:
        if feature in ("fsdp", "ep"):
            from shardcore.testing import assert_data_parallel_matches

            config = shardcore.ShardConfig(
                tensor_parallel_size=1,
                data_parallel="fsdp" if feature == "fsdp" else "ddp",
                expert_parallel_size=2 if feature == "ep" else 1,
            )
            from shardcore.tensor_parallel import count_collectives

            with count_collectives() as counts:
                assert_data_parallel_matches(make, batch, config)
            if feature == "ep" and not counts.get("all_to_all"):  # the tokens never went to another rank's experts
                raise AssertionError("expert parallelism ran no all-to-all")
        elif feature == "pp":
            assert_pipeline_matches(
                make, batch, shardcore.ShardConfig(pipeline_parallel_size=2, tensor_parallel_size=1)
            )
        else:
            megatron = feature == "split_gather"  # over the tensor-parallel group
            config = shardcore.ShardConfig(
                tensor_parallel_size=2 if megatron else 1,
                sequence_parallel_size=1 if megatron else 2,
                enable_sequence_parallelism=True,
                sequence_parallelism_mode=_SP[feature],
            )
            assert_sharded_matches(make, batch, config)
    except (NotImplementedError, ValueError, shardcore.ShardingCheckError) as err:  # on every rank alike
        return done("refused", f"{type(err).__name__}: {err}")
    # anything else is raised: a rank that failed alone must not leave the other waiting in a collective
    # (the pool gives it 10 s, then starts anew); the driver tells a difference (AssertionError) from an error
    return done("exact")


def table(rows: list[dict], version: str, features: list[str]) -> str:
    none = {"outcome": "not run", "reason": ""}
    rows = [{**{f: none for f in features}, **r} for r in rows]  # a feature added after the row was swept
    swept = [r for r in rows if any(r[f]["outcome"] != "not swept" for f in features)]
    totals = []
    for f in features:
        counts: dict[str, int] = {}
        for r in swept:
            counts[r[f]["outcome"]] = counts.get(r[f]["outcome"], 0) + 1
        totals.append(f"| {f} | " + " | ".join(str(counts.get(k, 0)) for k in _OUTCOMES) + " |")
    lines = [
        f"# The zero-config families, feature by feature (transformers {version})",
        "",
        "Written by `python benchmarks/features.py`; see its docstring for the cells.",
        "",
        f"{len(swept)} causal-LM families sharded by the plans their configs ship (of {len(rows)} tried):",
        "",
        "| feature | " + " | ".join(_OUTCOMES) + " |",
        "|---|" + "---|" * len(_OUTCOMES),
        *totals,
        "",
        "| family | " + " | ".join(features) + " |",
        "|---|" + "---|" * len(features),
    ]
    for r in swept:
        cells = [
            r[f]["outcome"] + (f": {r[f]['reason'][:90]}" if r[f]["outcome"] not in ("exact", "n/a") else "")
            for f in features
        ]
        lines.append(f"| {r['family']} | " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines) + "\n"


_OUTCOMES = ("exact", "refused", "wrong", "inconclusive", "error", "cannot build", "n/a", "not run")


def _last_line(err: Exception) -> str:
    """The exception a rank raised: the last line of its traceback in the pool's error."""
    import re

    raised = [line.strip() for line in str(err).splitlines() if re.match(r"[\w.]*(Error|Exception)\b", line.strip())]
    return (raised[-1] if raised else str(err).splitlines()[0])[:300]


def _write(out: pathlib.Path, rows: list[dict], start: float, features: list[str]) -> None:
    import transformers

    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"transformers": transformers.__version__, "seconds": round(time.perf_counter() - start), "families": rows}
    out.write_text(json.dumps(record, indent=1) + "\n")
    out.with_suffix(".md").write_text(table(rows, transformers.__version__, features))


def _kept(out: pathlib.Path) -> dict[str, dict]:
    """The rows of the record at ``out`` by family (``--merge``), none when there is none."""
    if not out.is_file():
        return {}
    return {row["family"]: row for row in json.loads(out.read_text())["families"]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="model types (default: every causal-LM family)")
    parser.add_argument("--features", nargs="*", choices=FEATURES, default=list(FEATURES))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "features.json"))
    parser.add_argument("--merge", action="store_true", help="keep the other features' cells from --out")
    args = parser.parse_args(argv)
    kept = _kept(pathlib.Path(args.out)) if args.merge else {}
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the pool's workers import this module and families by name
    os.environ.setdefault("SHARDCORE_COLLECTIVE_TIMEOUT", "60")  # a cell that hangs a collective ends there
    import features as me
    import transformers
    from families import families

    from shardcore.distributed.launcher import RankError
    from shardcore.testing import close_pools, run_on_ranks

    chosen = families(["causal-lm"], args.only)
    shown = [f for f in FEATURES if f in args.features or any(f in r for r in kept.values())]
    print(f"{len(chosen)} causal-LM families, transformers {transformers.__version__}", flush=True)
    rows, start = [], time.perf_counter()
    try:
        for i, (model_type, _, name) in enumerate(chosen):
            row = {"family": model_type, "model": name}
            for feature in args.features:
                try:
                    row[feature] = run_on_ranks(2, me.one_cell, model_type, name, feature)[0]
                except RankError as err:  # raised on a rank (the pool is made anew where it broke)
                    close_pools(2)  # a rank left in a collective breaks the group: the next cell gets a new pool
                    said = _last_line(err)
                    outcome = "error"
                    if "AssertionError" in said:  # the kit: a difference, or a gradient too small to compare
                        outcome = "inconclusive" if "too small to test" in said else "wrong"
                    row[feature] = {
                        "outcome": outcome,
                        "reason": said,
                        "seconds": None,
                    }
                if row[feature]["outcome"] == "not swept":  # (one that cannot build may with sdpa: the next)
                    break
            for feature in args.features:
                row.setdefault(feature, row[args.features[0]])
            row = {**kept.get(model_type, {}), **row}
            rows.append(row)
            said = " ".join(f"{f}={row[f]['outcome']}" for f in args.features)
            print(f"[{i + 1}/{len(chosen)}] {model_type}: {said}", flush=True)
            others = [r for t, r in kept.items() if t not in {r["family"] for r in rows}]  # not run now: kept
            _write(pathlib.Path(args.out), sorted(rows + others, key=lambda r: r["family"]), start, shown)
    finally:
        close_pools()
    print(table(rows, transformers.__version__, shown).split("\n\n")[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
