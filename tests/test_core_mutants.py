"""The mutation harness cannot rot: every mutant's snippets occur exactly once in their file, and
every mutant declares one existing test and a message fragment (< 1 s; the harness itself runs
in ``nox -s mutants``, its fast part in CI)."""

from __future__ import annotations

import importlib.util
import itertools
import pathlib
import re
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
    name, source = test.split("[")[0], (ROOT / path).read_text()
    # a test function, or a test bound to one of the kit's suite (test_x = FAMILY.matches(...))
    assert f"def {name}(" in source or f"\n{name} = " in source, f"{mutant.test}: no such test function"
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


def _locals(text: str, where: str) -> list[str]:
    """The local variables the definition ``where`` assigns (not its parameters), in first-seen order."""
    import ast

    node = ast.parse(text).body
    for part in where.split("."):
        node = next(n for n in node if getattr(n, "name", None) == part)
        node = node if part == where.split(".")[-1] else node.body
    found = [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    return list(dict.fromkeys(found))


def _renamed(text: str, where: str, old: str, new: str) -> str:
    """``text`` with the local ``old`` renamed ``new`` inside ``where`` (not as an attribute or a keyword argument)."""
    import io
    import tokenize

    start, end = mutants.definition(text, where)
    inside = text[start:end]
    lines = inside.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    spans = []
    for tok in tokenize.generate_tokens(io.StringIO(inside).readline):
        if tok.type == tokenize.NAME and tok.string == old:
            at = offsets[tok.start[0] - 1] + tok.start[1]
            after = inside[at + len(old) :]
            before = inside[:at]
            if before.endswith((".", "def ", "class ")):
                continue  # an attribute, or the definition's own name
            if not (after.startswith("=") and not after.startswith("==")):
                spans.append(at)
    for at in reversed(spans):
        inside = inside[:at] + new + inside[at + len(old) :]
    return text[:start] + inside + text[end:]


def test_a_local_renamed_inside_a_mutated_function_leaves_every_mutant_applicable():
    """On a copy of each mutated file, a local variable of the mutated function (one the mutant's code
    names, where it names one) renamed everywhere in the function: the mutant still applies, and makes
    the same edit as before, under the new name."""
    renamed_some = 0
    for mutant in mutants.MUTANTS.values():
        text = (ROOT / mutant.file).read_text()
        if not mutant.where or mutant.where.split(".")[-1][0].isupper():
            continue  # a module's or a class's body: no local variables
        names = _locals(text, mutant.where)
        named = [n for n in names if any(n in code for code, _ in mutant.edits)]
        for old in (named or names)[:1]:
            copy = _renamed(text, mutant.where, old, f"{old}_renamed")
            assert copy != text, (mutant.name, old)
            mutated = mutants.apply(mutant, copy)  # a MutantError when it no longer applies
            assert mutated != copy, mutant.name
            expected = _renamed(mutants.apply(mutant, text), mutant.where, old, f"{old}_renamed")
            assert mutated == expected, f"{mutant.name}: after renaming {old}, the mutant edits something else"
            renamed_some += 1
    assert renamed_some > 150, renamed_some


def _recommented(text: str, where: str) -> str:
    """``text`` with every comment inside ``where`` reworded, a comment added at the end of every code line
    that had none, and a comment line added before each statement (at the statement's indentation)."""
    import io
    import tokenize

    start, end = mutants.definition(text, where)
    inside = text[start:end]
    lines = inside.splitlines(keepends=True)
    tokens = list(tokenize.generate_tokens(io.StringIO(inside).readline))
    commented = {t.start[0] for t in tokens if t.type == tokenize.COMMENT}
    ends = {t.start for t in tokens if t.type in (tokenize.NEWLINE, tokenize.NL) and t.start[0] not in commented}
    firsts = {}  # {row: indentation} of the first line of each statement after the definition's first line
    for prev, tok in itertools.pairwise(tokens):
        if prev.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT) and tok.start[0] > 1:
            if tok.type not in (tokenize.DEDENT, tokenize.INDENT, tokenize.ENDMARKER, tokenize.NL):
                firsts[tok.start[0]] = tok.start[1]
    for tok in reversed(tokens):
        row, col = tok.start
        if tok.type == tokenize.COMMENT:
            lines[row - 1] = lines[row - 1][:col] + "# reworded: another note entirely" + lines[row - 1][tok.end[1] :]
        elif (row, col) in ends and lines[row - 1][:col].strip():
            lines[row - 1] = lines[row - 1][:col] + "  # a note added" + lines[row - 1][col:]
    for row in sorted(firsts, reverse=True):
        lines.insert(row - 1, " " * firsts[row] + "# a line of notes added\n")
    return text[:start] + "".join(lines) + text[end:]


def _code_only(text: str) -> list[str]:
    from mutant_kit import _uncommented  # (tests/ is on the path: mutants.py imports it)

    return [line.rstrip() for line in _uncommented(text).splitlines() if line.strip()]


def test_comments_reworded_or_added_inside_a_mutated_function_leave_every_mutant_applicable():
    """On a copy of each mutated file, every comment of the mutated definition reworded, one added at the
    end of each code line and one line of them before each statement: the mutant still applies, and
    makes the same edit as before (the code alike once the comments are dropped)."""
    for mutant in mutants.MUTANTS.values():
        text = (ROOT / mutant.file).read_text()
        copy = _recommented(text, mutant.where) if mutant.where else text
        assert copy != text or not mutant.where, mutant.name
        mutated = mutants.apply(mutant, copy)  # a MutantError when it no longer applies
        assert _code_only(mutated) == _code_only(mutants.apply(mutant, text)), (
            f"{mutant.name}: with its comments changed, the mutant edits something else"
        )


def test_a_removed_function_is_reported_by_name():
    mutant = mutants.MUTANTS["policy-mixed-blocks-accepted"]
    text = (ROOT / mutant.file).read_text().replace("def block_type(", "def block_kind(")
    with pytest.raises(mutants.MutantError, match=r"shardcore/policy\.py has no block_type \(removed or renamed\)"):
        mutants.apply(mutant, text)


def _reworded(text: str, where: str) -> str:
    """``text`` with every message inside ``where`` (``mutant_kit._messages``: a one-line string literal with
    a space in it) reworded: ``"x is bad"`` becomes ``"reworded: x is bad"``."""
    from mutant_kit import _messages

    start, end = mutants.definition(text, where)
    inside, out, at = text[start:end], [], 0
    for s, e, literal in _messages(inside):
        quote = next(i for i, c in enumerate(literal) if c in "\"'") + 1
        out += [inside[at:s], literal[:quote] + "reworded: " + literal[quote:]]
        at = e
    return text[:start] + "".join(out) + inside[at:] + text[end:]


def _message_pieces(text: str, where: str) -> list[str]:
    """The words of each message inside ``where``, cut at an f-string's fields: what rewording changes."""
    from mutant_kit import _messages

    start, end = mutants.definition(text, where)
    pieces = [p.strip() for _, _, lit in _messages(text[start:end]) for p in re.split(r"\{[^}]*\}", lit)]
    return [p.strip("\"'rfb ") for p in pieces if len(p.strip("\"'rfb ")) >= 8]


def test_messages_reworded_inside_a_mutated_function_leave_every_mutant_applying_and_its_check_standing():
    """On a copy of each mutated file, every message of the mutated definition reworded: the mutant still
    applies and makes the same edit (the code alike but for the messages); and no mutant's declared check
    is words of those messages (a check the function words itself is declared by where it raises,
    ``mutant_kit.Raised``), so the rewording cannot leave it uncaught."""
    worded, reworded_some = [], 0
    for mutant in mutants.MUTANTS.values():
        text = (ROOT / mutant.file).read_text()
        copy = _reworded(text, mutant.where)
        reworded_some += copy != text
        mutated = mutants.apply(mutant, copy)  # a MutantError when it no longer applies
        assert _without_messages(mutated) == _without_messages(mutants.apply(mutant, text)), (
            f"{mutant.name}: with its messages reworded, the mutant edits something else"
        )
        if isinstance(mutant.expect, str):
            pieces = _message_pieces(text, mutant.where)
            if any(p in mutant.expect or mutant.expect in p for p in pieces):
                worded.append(f"{mutant.name} ({mutant.where}): {mutant.expect!r}")
    assert reworded_some > 100, reworded_some
    assert not worded, "checks worded by the mutated function itself (declare them as Raised):\n" + "\n".join(worded)


def _without_messages(text: str) -> list[str]:
    from mutant_kit import _STRING

    return [_STRING.sub('"…"', line) for line in _code_only(text)]


def test_a_check_declared_by_where_it_raises_is_caught_there_only(tmp_path):
    """The report names where a failure was raised (the innermost frame outside pytest; each rank's, for a
    RankError): a mutant declared ``Raised`` is caught by that line, not by another place or type."""
    from mutant_kit import Mutant, Raised

    class Ranked(RuntimeError):
        tracebacks = {
            1: 'Traceback (most recent call last):\n  File "/x/site-packages/shardcore/a.py", line 3, in f\n'
            "    g()\n"
            '  File "/x/site-packages/shardcore/b.py", line 9, in check\nValueError: 3 is not divisible\n'
        }

    def fail():
        raise Ranked("a call failed on rank 1")

    with pytest.raises(Ranked) as excinfo:
        fail()
    sites = mutants_report.raise_sites(excinfo)
    assert "raised ValueError in shardcore/b.py::check" in sites, sites
    assert any(s.startswith("raised Ranked in ") and s.endswith("::fail") for s in sites), sites
    report = {"t.py::test_x": "Ranked: a call failed on rank 1\n" + "\n".join(sites)}

    def outcome(expect):
        return mutants._outcome(Mutant("x", "bug", "f.py", "", (("a", "b"),), "t.py::test_x", expect), 1, report)

    assert outcome(Raised("ValueError", "shardcore/b.py::check")) == "caught"
    assert outcome(Raised("ValueError", "shardcore/a.py::f")).startswith("not caught")  # passed through, not raised
    assert outcome(Raised("TypeError", "shardcore/b.py::check")).startswith("not caught")
