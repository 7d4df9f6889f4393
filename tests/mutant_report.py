"""A pytest plugin for the mutation harness (``-p mutant_report``): writes, for every failed test, its
failure report alone to ``$SHARDCORE_MUTANT_REPORT`` (JSON ``{node id: text}``): the exception's
type and message (with ``--assert=plain``, an assert's own message, no introspection of its
expression), without any echo of source lines, so a mutant's declared message can only match what
the failure said, never the test's code; then a line ``raised <type> in <file>::<function>`` for where the
failure was raised (the innermost frame; for a ``RankError``, each failing rank's): a mutant declared by
where its check raises (``mutant_kit.Raised``) matches that line, whatever the message says."""

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


#: a rank's traceback: each frame, and the exception's line at the end
_FRAME_AT = re.compile(r'^\s*File "(?P<path>.*)", line \d+, in (?P<function>\S+)')
_ERROR = re.compile(r"^(?P<error>[A-Za-z_][\w.]*)(?::|$)")


def _site(path: str, function: str, error: str) -> str:
    """``raised <error> in <path>::<function>``, the path relative to the run's directory (the harness's
    scratch copy) or to site-packages."""
    path = os.path.abspath(path)
    here = os.getcwd() + os.sep
    path = path[len(here) :] if path.startswith(here) else path.rpartition("site-packages" + os.sep)[2]
    return f"raised {error.rpartition('.')[2]} in {path}::{function}"


def raise_sites(excinfo) -> list[str]:
    """Where a failure was raised: its innermost frame outside pytest, and for an exception carrying ranks' tracebacks
    (``RankError.tracebacks``) each rank's innermost frame and exception."""
    # (pytest's own frames skipped: a pytest.raises that saw another error fails in the test's with-block)
    entry = next(
        (e for e in reversed(excinfo.traceback) if not any(s in str(e.path) for s in ("_pytest", "pluggy"))),
        excinfo.traceback[-1],
    )
    sites = [_site(str(entry.path), entry.name, excinfo.typename)]
    for text in getattr(excinfo.value, "tracebacks", {}).values():
        frames = [f for f in map(_FRAME_AT.match, text.splitlines()) if f]
        errors = [e for e in map(_ERROR.match, text.strip().splitlines()[-1:]) if e]
        if frames and errors:
            sites.append(_site(frames[-1]["path"], frames[-1]["function"], errors[0]["error"]))
    return sorted(set(sites))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        sites = "".join(f"\n{site}" for site in raise_sites(call.excinfo))
        _REPORTS[item.nodeid] = _REPORTS.get(item.nodeid, "") + without_source(call.excinfo.exconly()) + sites


def pytest_sessionfinish(session):
    path = os.environ.get("SHARDCORE_MUTANT_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(_REPORTS, f)
