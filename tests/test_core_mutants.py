"""The mutation harness cannot rot: every mutant's snippets occur exactly once in their file, and
every mutant declares one existing test and a message fragment (< 1 s; the harness itself runs
in ``nox -s mutants``, its fast part in CI)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("shardcore_mutants", ROOT / "tests" / "mutants.py")
mutants = sys.modules.setdefault("shardcore_mutants", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(mutants)
_report_spec = importlib.util.spec_from_file_location("shardcore_mutant_report", ROOT / "tests" / "mutant_report.py")
mutants_report = importlib.util.module_from_spec(_report_spec)
_report_spec.loader.exec_module(mutants_report)


@pytest.mark.parametrize("name", sorted(mutants.MUTANTS))
def test_mutant_applies_and_declares_its_check(name):
    mutant = mutants.MUTANTS[name]
    text = (ROOT / mutant.file).read_text()
    assert mutants.apply(mutant, text) != text  # raises SystemExit when a snippet is not there exactly once
    path, _, test = mutant.test.partition("::")
    assert (ROOT / path).is_file() and test, mutant.test
    assert f"def {test.split('[')[0]}(" in (ROOT / path).read_text(), f"{mutant.test}: no such test function"
    assert mutant.expect


def test_every_declared_message_names_one_failure():
    """A mutant's message says which check failed: not a bare exception name or a short word any
    failure of its test prints, and no two mutants declare the same test and message."""
    vague = [why for m in mutants.MUTANTS.values() if (why := mutants.vague(m))]
    assert not vague, "\n".join(vague)
    pairs = [(m.test, m.expect) for m in mutants.MUTANTS.values()]
    shared = sorted({p for p in pairs if pairs.count(p) > 1})
    assert not shared, f"mutants declaring the same test and message: {shared}"


def test_the_report_holds_no_source_line():
    """The failure report the harness matches strips the source lines a rank's traceback echoes."""
    text = 'RankError: f failed\n  File "/t/test_x.py", line 9, in g\n    assert kept == 3\n    ^^^^\nValueError: boom'
    assert (
        mutants_report.without_source(text)
        == 'RankError: f failed\n  File "/t/test_x.py", line 9, in g\nValueError: boom'
    )


def test_ci_runs_a_subset_that_covers_each_part_of_the_core():
    """CI's fast subset holds a mutant of every core subpackage that has one, of the core's
    top-level modules and of a plugin: a part whose checks rot is seen in CI, not at the next full run."""

    def part(file: str) -> str:
        return mutants.area(file) if file.count("/") > 1 else "the top-level modules"

    fast = [m for m in mutants.MUTANTS.values() if m.fast]
    areas = {part(m.file) for m in mutants.MUTANTS.values() if m.file.startswith("shardcore/")}
    missing = areas - {part(m.file) for m in fast}
    assert not missing, f"no fast mutant in {sorted(missing)}"
    assert any(m.file.startswith("plugins/") for m in fast), "no fast mutant in a plugin"
    assert len(fast) <= 24, [m.name for m in fast]  # CI's time: about 10 s each


def test_no_new_computing_file_without_a_mutant():
    """The computing source files without a mutant (docs/mutants-uncovered.txt) may only shrink: a new
    file comes with its mutant, and a file given one leaves the list."""
    listed = (ROOT / "docs" / "mutants-uncovered.txt").read_text().split()
    now = mutants.uncovered()
    assert not set(now) - set(listed), f"computing files without a mutant: {sorted(set(now) - set(listed))}"
    assert not set(listed) - set(now), f"covered or gone now, remove from the list: {sorted(set(listed) - set(now))}"


def test_committed_score_is_the_whole_harness_and_the_readme_quotes_it():
    import json

    record = json.loads((ROOT / "docs" / "mutants.json").read_text())
    assert [r["mutant"] for r in record["mutants"]] == list(mutants.MUTANTS), "re-run nox -s mutants and commit"
    assert record["caught"] == sum(r["outcome"] == "caught" for r in record["mutants"]) == record["total"]
    assert mutants.readme_table(record) in (ROOT / "docs" / "plugins.md").read_text(), (
        "paste the table nox -s mutants prints"
    )
