"""Merge a run of named mutants (``python tests/mutants.py --no-baseline NAME ...``, which writes
``bench-results/mutants-fast.json``) into the committed record ``docs/mutants.json``, in the harness's
order, each merged entry marked with the commit it ran on; mutants no longer in the harness are dropped.
Then paste the table into ``docs/plugins.md`` (``tests/test_core_mutants.py`` checks both).

    python tests/merge_mutants.py COMMIT [--note TEXT]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import mutants  # noqa: E402


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit")
    parser.add_argument("--note", default="", help="appended to the record's note")
    args = parser.parse_args(argv)
    record_path = ROOT / "docs" / "mutants.json"
    record = json.loads(record_path.read_text())
    ran = json.loads((ROOT / "bench-results" / "mutants-fast.json").read_text())
    ran = {r["mutant"]: r | {"commit": args.commit} for r in (ran["mutants"] if isinstance(ran, dict) else ran)}
    kept = {r["mutant"]: r for r in record["mutants"]}
    missing = [n for n in mutants.MUTANTS if n not in ran and n not in kept]
    if missing:
        raise SystemExit(f"never run: {missing}; run them by name first")
    record["mutants"] = [ran.get(n, kept.get(n)) for n in mutants.MUTANTS]
    record["total"] = len(record["mutants"])
    record["caught"] = sum(r["outcome"] == "caught" for r in record["mutants"])
    if args.note:
        record["note"] = record["note"].rstrip() + " " + args.note
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    plugins = ROOT / "docs" / "plugins.md"
    text = plugins.read_text()
    table = mutants.readme_table(record)
    start = text.index("**", text.index(re.search(r"\*\*\d+/\d+ caught by their declared check\*\*", text).group(0)))
    end = text.index("\n\n", text.index("| mutant | the bug |", start))
    plugins.write_text(text[:start] + table.rstrip("\n") + text[end:])
    print(f"{record['caught']}/{record['total']} caught; {len(ran)} merged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
