"""The test run's own plumbing (every test path is under this directory): with ``SHARDCORE_MARGINS`` set
(``nox -s tests`` sets it), the kit's comparisons that kept less than 0.3 of their tolerance are listed
at the end of the run (``shardcore.testing.tolerance``; ``nox -s margins`` writes the whole report); the
tests listed in ``tests/slow_tests.txt`` are marked slow (``nox -s tests-slow``); ``--part K/N`` runs one
of N parts of what was selected."""

from __future__ import annotations

import os
import pathlib

import pytest


def pytest_terminal_summary(terminalreporter) -> None:
    path = os.environ.get("SHARDCORE_MARGINS")
    if not path:
        return
    from shardcore.testing.tolerance import margin_report, read_margins

    terminalreporter.section("the kit's margins (worst error / tolerance)")
    for line in margin_report(read_margins(path)):
        terminalreporter.write_line(line)


#: the tests ``nox -s tests`` leaves to ``nox -s tests-slow`` by their measured time (tests/slow_tests.txt)
SLOW_LIST = pathlib.Path(__file__).parent / "tests" / "slow_tests.txt"


def _slow_listed() -> set[str]:
    lines = (line.split(None, 1) for line in SLOW_LIST.read_text().splitlines() if line and line[0] != "#")
    return {node.strip() for _, node in lines}


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--part",
        default=None,
        help="K/N: run the K-th of N parts of the selected tests, whole files dealt round by name "
        "(CI runs one part of tests-slow in its turn)",
    )


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the listed tests are slow when it does
def pytest_collection_modifyitems(config, items) -> None:
    listed = _slow_listed()
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.slow)
    # a listed test gone (renamed, removed) from a file this run collected whole: the list is stale
    whole = {pathlib.Path(a).resolve() for a in config.args if "::" not in a}
    root = pathlib.Path(config.rootpath)
    collected = {(i.nodeid.split("::")[0], i.nodeid.split("::")[1].split("[")[0]) for i in items if "::" in i.nodeid}
    for node in listed:
        path, name = node.split("::")[0], node.split("::")[1].split("[")[0]
        here = (root / path).resolve()
        if any(here == w or w in here.parents for w in whole) and here.exists() and (path, name) not in collected:
            raise pytest.UsageError(f"tests/slow_tests.txt names {node}, which is not in {path}: update the list")
    part = config.getoption("--part")
    if part:
        k, n = (int(x) for x in part.split("/"))
        files = sorted({i.nodeid.split("::")[0] for i in items})
        mine = set(files[k - 1 :: n])
        keep = [i for i in items if i.nodeid.split("::")[0] in mine]
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid.split("::")[0] not in mine])
        items[:] = keep
