"""A pytest plugin for the mutation harness (``-p mutant_report``): writes, for every failed test, its
failure report alone to ``$SHARDCORE_MUTANT_REPORT`` (JSON ``{node id: text}``): the exception's
type and message (with ``--assert=plain``, an assert's own message, no introspection of its
expression), without any echo of source lines, so a mutant's declared message can only match what
the failure said, never the test's code."""

from __future__ import annotations

import json
import os
import re

import pytest

_REPORTS: dict[str, str] = {}
#: a traceback's frame line ('  File "x.py", line 3, in f'): the line after it echoes source
_FRAME = re.compile(r'^\s*File ".*", line \d+')


def without_source(text: str) -> str:
    """``text`` less the source lines a traceback inside it echoes (a rank's traceback, carried in a
    ``RankError``): the line after each ``File "...", line N`` and the ``^^^`` markers under it."""
    out, skip = [], False
    for line in text.splitlines():
        if skip:
            skip = False
            continue
        if _FRAME.match(line):
            skip = True
        elif set(line.strip()) <= set("^~") and line.strip():
            continue
        out.append(line)
    return "\n".join(out)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        _REPORTS[item.nodeid] = _REPORTS.get(item.nodeid, "") + without_source(call.excinfo.exconly())


def pytest_sessionfinish(session):
    path = os.environ.get("SHARDCORE_MUTANT_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(_REPORTS, f)
