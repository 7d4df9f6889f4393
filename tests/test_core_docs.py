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


#: Python blocks in the docs that are not a snippet include of code a test runs (nor the README's
#: example, which a test compares with examples/quickstart.py), per page: each to become one; the
#: numbers may only go down.
UNTESTED_BLOCKS: dict[str, int] = {}

INCLUDE = re.compile(r'^--8<-- "([^":]+)(?::([\w-]+))?"$', re.M)


def test_python_blocks_in_the_docs_are_code_a_test_runs():
    example = _example_block()
    counts = {}
    for page in sorted(DOCS.glob("*.md")):
        blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
        untested = [b for b in blocks if not INCLUDE.search(b) and b != example]
        if untested:
            counts[page.name] = len(untested)
    grown = {p: n for p, n in counts.items() if n > UNTESTED_BLOCKS.get(p, 0)}
    assert not grown, f"new untested code blocks (include them from an examples/ file a test runs): {grown}"
    assert counts == UNTESTED_BLOCKS, f"fewer untested blocks now: lower UNTESTED_BLOCKS to {counts}"


def test_every_snippet_include_is_a_section_of_code_the_tests_run():
    """An include names a file and a section that exist (the site's build checks the same): test
    code, a plugin the tests install, or an ``examples/`` file a test names."""
    files = [*(ROOT / "tests").glob("**/test_*.py"), *(ROOT / "plugins").glob("*/tests/test_*.py")]
    tests = "\n".join(f.read_text() for f in files)
    includes = [(page.name, *m) for page in sorted(DOCS.glob("*.md")) for m in INCLUDE.findall(page.read_text())]
    assert len(includes) >= 21, includes  # the check below has something to check
    for page, path, section in includes:
        file = ROOT / path
        assert file.is_file(), f"{page}: {path} does not exist"
        if section:
            text = file.read_text()
            assert f"--8<-- [start:{section}]" in text and f"--8<-- [end:{section}]" in text, (page, path, section)
        parts = pathlib.PurePosixPath(path).parts
        if parts[0] == "examples":
            stem = pathlib.PurePosixPath(path).stem
            assert f'"{stem}"' in tests or file.name in tests, f"{page}: {path} is run by no test"
        elif parts[:2] == ("benchmarks", "results"):  # a committed result a test checks (the feature table)
            assert file.name in tests, f"{page}: {path} is checked by no test"
        else:
            assert parts[0] == "tests" or (parts[0] == "plugins" and not parts[1].startswith("_")), (
                f"{page}: {path} is not code the tests run"
            )
