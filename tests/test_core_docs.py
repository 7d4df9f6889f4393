"""The documentation's shape: every page is in the site's navigation, the site's home is the
README, the README stays short. (The site itself is built, ``--strict``, by ``nox -s docs``.)"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def test_the_readme_is_short_and_the_sites_home_is_it():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250, "README over 250 lines: move the detail to a page under docs/"
    assert (DOCS / "index.md").read_text() == readme.replace("](docs/", "]("), "regenerate docs/index.md"


def test_every_page_is_in_the_navigation_and_every_link_to_a_page_resolves():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert [p for p in pages if f": {p}" not in nav] == [], "add the page to mkdocs.yml's nav"
    readme = (ROOT / "README.md").read_text()
    missing = [m for m in re.findall(r"\]\(docs/([\w.-]+\.md)", readme) if not (DOCS / m).is_file()]
    assert not missing, missing


def _example_block() -> str:
    import textwrap

    text = (ROOT / "examples" / "quickstart.py").read_text()
    body = text[text.index("# --8<-- [start:readme]\n") : text.index("# --8<-- [end:readme]")].split("\n", 1)[1]
    return textwrap.dedent(body.rsplit("\n", 1)[0] + "\n")


#: Python blocks in the docs that are neither an ``examples/`` file (a snippet include, or the
#: README's example, both run by tests) nor a doctest, per page: each to become one; the numbers
#: may only go down.
UNTESTED_BLOCKS = {
    "checkpoints.md": 2,
    "data_parallel.md": 1,
    "kernels.md": 1,
    "parallelize.md": 1,
    "pipeline_parallel.md": 1,
    "plans.md": 1,
    "plugins.md": 2,
    "quickstart.md": 3,
    "sequence_parallel.md": 1,
    "user_workflow.md": 4,
    "writing_a_policy.md": 1,
}


def test_python_blocks_in_the_docs_are_examples_a_test_runs():
    example = _example_block()
    counts = {}
    for page in sorted(DOCS.glob("*.md")):
        blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
        untested = [b for b in blocks if "--8<-- " not in b and ">>>" not in b and b != example]
        if untested:
            counts[page.name] = len(untested)
    grown = {p: n for p, n in counts.items() if n > UNTESTED_BLOCKS.get(p, 0)}
    assert not grown, f"new untested code blocks (make them an examples/ file a test runs, or a doctest): {grown}"
    assert counts == UNTESTED_BLOCKS, f"fewer untested blocks now: lower UNTESTED_BLOCKS to {counts}"
