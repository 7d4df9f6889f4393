"""Mutation testing of the conformance kit: deliberate bugs in the core, the plugins and the kit
itself, each of which one declared check must catch (``nox -s mutants``; CI runs the ``fast`` ones).

Each mutant edits one function (or class, or module) of one source file, found by its qualified name,
its edits matched there as patterns that survive a local rename (``tests/mutant_kit.py``; a mutant that no
longer applies is an error naming its function, not a silent pass: ``tests/test_core_mutants.py`` checks
that in CI), in a scratch copy of the repository, and runs the ONE test it declares with
the copy first on ``PYTHONPATH``. A mutant is *caught* only when that test fails and its failure
report (the exception's text, asserts run plain, no line of source: ``tests/mutant_report.py``)
holds the declared message fragment, a fragment specific to that failure, or names the declared
place the failure was raised (``mutant_kit.Raised``: a check whose message the mutated function words
itself is declared so, and a reworded message leaves it standing) (:func:`vague`; each
mutant's (test, message) pair its own); any other failure (an error elsewhere, a crash with
another message, the message only in the test's code), a time-out or a hang is *not caught* and
reported as such. The unmutated copy
must pass the same tests first. The full run writes ``docs/mutants.json`` (committed, the score
in docs/plugins.md); ``--fast`` writes ``bench-results/mutants-fast.json``.

    python tests/mutants.py [--fast] [NAME ...]     # all mutants, the fast ones, or the named ones
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
LLAMA = "plugins/shard-llama/tests"
#: a hang inside a test (the rank pool's call time-out is 330 s) ends here first: not caught
TIMEOUT_S = 240


# the mutants themselves: one file per part of the code, beside the checks they claim (tests/mutant_kit.py)
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))
from mutant_kit import Mutant, MutantError, Raised, apply, definition  # noqa: E402, F401 - after the path the parts import it from; definition: for the tests


def part_files(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """The files declaring mutants: the core's parts, then each plugin's."""
    return [
        *sorted((root / "tests" / "mutant_parts").glob("*.py")),
        *sorted(root.glob("plugins/shard-*/tests/mutants_*.py")),
        *sorted(root.glob("tests/outside/shard-*/tests/mutants_*.py")),  # plugins from outside
    ]


def load(root: pathlib.Path = ROOT) -> dict[str, Mutant]:
    """``{name: mutant}`` from every part file, in :func:`part_files`' order; two mutants may not share a name."""
    import importlib.util

    out: dict[str, Mutant] = {}
    for path in part_files(root):
        spec = importlib.util.spec_from_file_location(f"mutant_part_{path.parent.parent.name}_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for mutant in module.MUTANTS:
            if mutant.name in out:
                raise MutantError(f"two mutants are named {mutant.name} ({path.relative_to(root)})")
            out[mutant.name] = mutant
    return out


MUTANTS: dict[str, Mutant] = load()


def _copy() -> pathlib.Path:
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="shardcore-mutant-"))
    ignore = shutil.ignore_patterns(".nox", ".git", "__pycache__", "bench-results", "*.egg-info", ".ruff_cache")
    # (README.md, LICENSE: shardcore's wheel builds from the copy, for the outside plugin's check)
    for name in ("shardcore", "plugins", "tests", "examples", "benchmarks", "pyproject.toml", "README.md", "LICENSE"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(
            src, scratch / name, **({"ignore": ignore} if src.is_dir() else {})
        )
    return scratch


def _run(
    scratch: pathlib.Path, tests: list[str], timeout: float = TIMEOUT_S
) -> tuple[int | None, str, float, dict[str, str]]:
    """Run ``tests`` in ``scratch`` within ``timeout`` seconds: ``(exit code or None on a time-out,
    output, seconds, {failed test: its failure report})``. Asserts run plain (their own message, no
    rewritten expression) and the reports come from ``tests/mutant_report.py``: the exceptions'
    text, no source line."""
    plugins = [str(p) for p in sorted((scratch / "plugins").iterdir()) if (p / "pyproject.toml").is_file()]
    path = os.pathsep.join([str(scratch), *plugins, str(scratch / "tests")])
    report = scratch / "failure-reports.json"
    report.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": path, "PYTHONHASHSEED": "0", "SHARDCORE_MUTANT_REPORT": str(report)}
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-rf", "-p", "no:cacheprovider", "-p", "mutant_report"]
    cmd += ["--assert=plain", *tests]
    try:
        proc = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", time.perf_counter() - start, {}
    reports = json.loads(report.read_text()) if report.is_file() else {}
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - start, reports


def _outcome(mutant: Mutant, code: int | None, reports: dict[str, str]) -> str:
    """``caught`` only when the declared test failed and its failure report (the exception's text,
    not the test's source, not pytest's other output) holds the declared message."""
    if code is None:
        return f"not caught: time-out after {TIMEOUT_S} s (a hang)"
    if code == 0:
        return "not caught: the test passed"
    mine = [text for test, text in reports.items() if test == mutant.test or test.startswith(mutant.test + "[")]
    if code != 1 or not mine:
        return f"not caught: pytest exit {code} without the declared test failing"
    if isinstance(mutant.expect, Raised):  # a line of its own: where the failure was raised
        if not any(str(mutant.expect) in text.splitlines() for text in mine):
            return f"not caught: {mutant.test} failed, but not with {mutant.expect}"
    elif not any(mutant.expect in text for text in mine):
        return f"not caught: {mutant.test} failed, but its report lacks {mutant.expect!r}"
    return "caught"


def vague(mutant: Mutant) -> str | None:
    """Why ``mutant``'s declared message could match a failure other than its own (``None``: it
    cannot): a bare exception name, or a fragment too short to say which check failed; a check declared
    by where it raises (:class:`Raised`) names its function."""
    if isinstance(mutant.expect, Raised):
        return None
    if re.fullmatch(r"\w*(Error|Exception|Timeout|Lost)", mutant.expect):
        return f"{mutant.name}: {mutant.expect!r} is a bare exception name, any failure of the test says it"
    if len(mutant.expect) < 12:
        return f"{mutant.name}: {mutant.expect!r} is too short to name one failure"
    return None


def area(file: str) -> str:
    """The part of the code a source file belongs to: a core subpackage or top-level module
    (``tensor_parallel``, ``grad_norm``), or a plugin (``shard-llama``)."""
    parts = file.split("/")
    if parts[0] == "plugins":
        return parts[1]
    if parts[:2] == ["tests", "outside"]:
        return parts[2]
    return parts[1] if len(parts) > 2 else parts[1].removesuffix(".py")


def _computes(function) -> bool:
    """Whether a function's body does more than declare: a docstring, ``pass``, ``...``, returning a
    literal or raising (a hook specification, a contract's default) compute nothing."""
    import ast

    def declares(node) -> bool:
        if isinstance(node, ast.Pass | ast.Raise):
            return True
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            return True  # a docstring or ...
        if isinstance(node, ast.Return):  # nothing, or a literal naming and calling nothing
            return node.value is None or not any(
                isinstance(n, ast.Name | ast.Call | ast.Attribute) for n in ast.walk(node.value)
            )
        return False

    return not all(declares(node) for node in function.body)


def computing_files() -> list[str]:
    """The source files of the core and the plugins' packages that define a function that computes
    something (:func:`_computes`), rather than only import, declare or re-export."""
    import ast

    files = sorted([*ROOT.glob("shardcore/**/*.py"), *ROOT.glob("plugins/shard-*/shard_*/**/*.py")])
    return [
        p.relative_to(ROOT).as_posix()
        for p in files
        if any(
            isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and _computes(n)
            for n in ast.walk(ast.parse(p.read_text()))
        )
    ]


def uncovered() -> list[str]:
    """The computing source files no mutant mutates."""
    covered = {m.file for m in MUTANTS.values()}
    return [f for f in computing_files() if f not in covered]


def per_area(record: dict) -> str:
    """``area: caught/total`` for each part of the code, from a run's record."""
    counts: dict[str, list[int]] = {}
    for r in record["mutants"]:
        c = counts.setdefault(area(r["file"]), [0, 0])
        c[0] += r["outcome"] == "caught"
        c[1] += 1
    return ", ".join(f"{a} {c}/{t}" for a, (c, t) in sorted(counts.items()))


def readme_table(record: dict) -> str:
    """The score line and table docs/plugins.md quotes, from a full run's record (``docs/mutants.json``)."""
    lines = [
        f"**{record['caught']}/{record['total']} caught by their declared check**.",
        "",
        f"By part of the code: {per_area(record)}.",
        "",
        "| mutant | the bug | declared check (test, message) | outcome |",
        "|---|---|---|---|",
    ]
    for r in record["mutants"]:
        m = MUTANTS[r["mutant"]]
        lines.append(f"| `{m.name}` | {m.bug} | `{pathlib.Path(m.test).name}`, {m.expect!r} | {r['outcome']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="only the mutants CI runs")
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the unmutated run of the declared tests (CI: the whole suite passed just before)",
    )
    parser.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    chosen = [MUTANTS[n] for n in args.names] if args.names else list(MUTANTS.values())
    chosen = [m for m in chosen if m.fast or not args.fast]
    scratch = _copy()
    results = []
    try:
        code, output, seconds = 0, "", 0.0
        if not args.no_baseline:
            tests = sorted({m.test for m in chosen})  # each test the bound one mutant's run has
            code, output, seconds, _ = _run(scratch, tests, timeout=TIMEOUT_S * len(tests))
            print(f"baseline (no mutant): pytest exit {code} in {seconds:.0f} s")
        if code != 0:
            print(output[-3000:])
            print("the unmutated tests must pass first")
            return 2
        for mutant in chosen:
            target = scratch / mutant.file
            original = target.read_text()
            target.write_text(apply(mutant, original))
            try:
                code, output, seconds, reports = _run(scratch, [mutant.test])
            finally:
                target.write_text(original)
            outcome = _outcome(mutant, code, reports)
            mine = [text for test, text in reports.items() if test == mutant.test or test.startswith(mutant.test + "[")]
            raised = sorted({line for text in mine for line in text.splitlines() if line.startswith("raised ")})
            results.append(
                {
                    "mutant": mutant.name,
                    "bug": mutant.bug,
                    "file": mutant.file,
                    "declared_check": f"{mutant.test} ({mutant.expect!r})",
                    "outcome": outcome,
                    "raised": raised,  # where the declared test's failure was raised (mutant_kit.Raised)
                    "seconds": round(seconds, 1),
                }
            )
            print(f"{seconds:5.0f} s  {mutant.name}: {outcome}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    caught = sum(r["outcome"] == "caught" for r in results)
    print(f"mutation score: {caught}/{len(results)} caught by their declared check")
    print(f"by part of the code: {per_area({'mutants': results})}")
    missing = uncovered()
    print(f"computing source files without a mutant: {len(missing)} of {len(computing_files())}")
    full = not args.fast and not args.names
    out = ROOT / ("docs/mutants.json" if full else "bench-results/mutants-fast.json")
    out.parent.mkdir(exist_ok=True)
    record = {"caught": caught, "total": len(results), "mutants": results}
    out.write_text(json.dumps(record, indent=2) + "\n")
    if full:  # docs/plugins.md quotes the committed record (tests/test_core_mutants.py checks it)
        print("\nthe table for docs/plugins.md:\n\n" + readme_table(record))
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
