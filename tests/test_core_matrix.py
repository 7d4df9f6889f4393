"""The feature table (``nox -s matrix``, ``benchmarks/matrix.py``) against what the families declare.

Committed: ``benchmarks/results/matrix.{json,md}``, every installed family's row (its
``plugins/shard-*/tests/matrix_*.py``) against every feature, each cell consistent (a declared feature
exact, a refused one refused). Here: the table is whole and consistent; each family's declarations
(``optimize``'s checks on paper, :func:`shardcore.explain.features.declared`) have not moved since the
table was measured; and a fast subset of cells is measured again, live, against the declaration.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from shardcore.explain.features import FEATURES
from shardcore.testing import run_on_ranks

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("matrix", ROOT / "benchmarks" / "matrix.py")
matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(matrix)

RESULTS = ROOT / "benchmarks" / "results"
CASES = {row: (path, case) for path in matrix.case_files().values() for row, case in matrix.load_cases(path).items()}

#: cells measured live in every run: new pipelines and sequence splits, a refusal, a kernel
LIVE = [
    ("bloom", "pp"),
    ("bloom", "sp_split_gather"),
    ("bloom", "sp_ulysses"),  # refused by name: BLOOM's attention is not transformers' registry
    ("glm4", "sp_ring"),
    ("mixtral", "pp"),
    ("opt", "sp_ulysses"),
    ("falcon", "sp_split_gather"),
]


def _record() -> dict:
    return json.loads((RESULTS / "matrix.json").read_text())


def test_the_committed_table_is_whole_and_consistent():
    record = _record()
    cells = {(c["row"], c["feature"]): c for c in record["cells"]}
    missing = [(row, f) for row in CASES for f in FEATURES if (row, f) not in cells]
    assert not missing, f"cells not in benchmarks/results/matrix.json, re-run nox -s matrix: {missing[:8]}"
    bad = [f"{c['row']} {c['feature']}: {c['outcome']} ({c.get('reason', '')[:120]})" for c in record["cells"]]
    bad = [b for b, c in zip(bad, record["cells"], strict=True) if not c["consistent"]]
    assert not bad, "cells that disagree with their family's declaration:\n" + "\n".join(bad)
    table = RESULTS / "matrix.md"  # docs/features.md includes it
    assert table.read_text() == matrix.table(record["cells"], record["transformers"]), (
        "benchmarks/results/matrix.md is not the table of matrix.json: re-run nox -s matrix"
    )


@pytest.mark.parametrize("row", sorted(CASES))
def test_the_declarations_have_not_moved_since_the_table(row):
    committed = {c["feature"]: c["declared"] is None for c in _record()["cells"] if c["row"] == row}
    now = {f: why is None for f, why in matrix.declared_row(CASES[row][1]).items()}
    moved = {f: f"{'declared' if now[f] else 'refused'} now" for f in now if now[f] != committed.get(f)}
    assert not moved, (
        f"{row}: the declarations changed since benchmarks/results/matrix.json: {moved}; re-run nox -s matrix"
    )


@pytest.mark.parametrize(("row", "feature"), LIVE, ids=[f"{r}-{f}" for r, f in LIVE])
def test_a_cell_measures_as_declared(row, feature):
    path, case = CASES[row]
    declared = matrix.declared_row(case)[feature]
    measured = run_on_ranks(FEATURES[feature][1], matrix.cell, str(path), row, feature, None)
    for result in measured:
        assert matrix.consistent(declared, result["outcome"]), (
            f"{row} {feature}: {'declared' if declared is None else 'refused: ' + declared}, "
            f"measured {result['outcome']}: {result.get('reason', '')}"
        )
