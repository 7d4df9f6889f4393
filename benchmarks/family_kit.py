"""The conformance kit's figures per family (not a test: the tests assert the bounds; this records
the numbers): for every case of each plugin's ``test_matches_unsharded``, the worst relative
gradient difference against the unsharded model (gathered, every parameter), the loss's relative
difference, the outputs' and the parameters' after 3 AdamW steps largest absolute differences.

    python benchmarks/family_kit.py [PLUGIN ...]     # default: every plugin whose *_tp.py has that test

Writes ``benchmarks/results/family_kit.json`` and prints a table. Runs on real gloo ranks (2 or 4)
from the installed environment (``nox -s tests`` builds it); each case is exactly the test's call.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: ``_check``'s arguments where a test's parameters are not exactly them
EXTRA = {"shard-llava": lambda args: (*args, "LlavaForConditionalGeneration")}
KEYS = ("max_rel_err_grads", "loss_rel_diff", "max_abs_diff_outputs", "max_abs_diff_after_steps")


def _module(plugin: pathlib.Path):
    (path,) = sorted((plugin / "tests").glob("test_*_tp.py"))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cases(test) -> list[tuple[str, tuple]]:
    """``(id, args)`` of every case of a test parametrized once (ids given) or over ``tp`` alone."""
    marks = [m for m in getattr(test, "pytestmark", []) if m.name == "parametrize"]
    if len(marks) != 1:
        return []
    (mark,) = marks
    names, values = mark.args[0], mark.args[1]
    ids = mark.kwargs.get("ids") or [str(v) for v in values]
    single = isinstance(names, str) and "," not in names
    return [(i, (v,) if single else tuple(v)) for i, v in zip(ids, values, strict=True)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plugins", nargs="*")
    args = parser.parse_args(argv)
    from shardcore.testing import close_pools, run_on_ranks

    plugins = sorted(p for p in (ROOT / "plugins").glob("shard-*") if list((p / "tests").glob("test_*_tp.py")))
    chosen = [p for p in plugins if not args.plugins or p.name in args.plugins]
    # every tests folder on the path before the rank pools start: their workers import the cases modules
    sys.path[:0] = [str(p / "tests") for p in chosen]
    results = []
    try:
        for plugin in chosen:
            module = _module(plugin)
            if not hasattr(module, "_check") or not _cases(getattr(module, "test_matches_unsharded", None)):
                print(f"{plugin.name:14} skipped: its kit test is not test_matches_unsharded(_check)", flush=True)
                continue
            for case, values in _cases(module.test_matches_unsharded):
                call = EXTRA.get(plugin.name, lambda a: a)(values)
                if not isinstance(call[0], int):  # the test's first parameter is not the TP size
                    print(f"{plugin.name:14} {case}: skipped (its parameters do not start with the TP size)")
                    continue
                report = run_on_ranks(call[0], module._check, *call)[0]
                row = {"plugin": plugin.name, "case": case, **{k: report.get(k) for k in KEYS}}
                results.append(row)
                print(f"{plugin.name:14} {case:24} " + "  ".join(f"{k}={row[k]:.3g}" for k in KEYS), flush=True)
    finally:
        close_pools()
    out = ROOT / "benchmarks" / "results" / "family_kit.json"
    import transformers

    record = {"transformers": transformers.__version__, "cases": results}
    if args.plugins:
        out = out.with_name("family_kit_partial.json")
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
