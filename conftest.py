"""The test run's own plumbing (every test path is under this directory): with ``SHARDCORE_MARGINS`` set
(``nox -s tests`` sets it), the kit's comparisons that kept less than 0.3 of their tolerance are listed
at the end of the run (``shardcore.testing.tolerance``; ``nox -s margins`` writes the whole report)."""

from __future__ import annotations

import os


def pytest_terminal_summary(terminalreporter) -> None:
    path = os.environ.get("SHARDCORE_MARGINS")
    if not path:
        return
    from shardcore.testing.tolerance import margin_report, read_margins

    terminalreporter.section("the kit's margins (worst error / tolerance)")
    for line in margin_report(read_margins(path)):
        terminalreporter.write_line(line)
