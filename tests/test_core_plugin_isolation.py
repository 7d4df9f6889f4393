"""Every plugin's suite passes with only the core and that plugin installed: its tests name no
model class (nor its config) that another plugin covers, except a composite plugin's parts (the
plugins its ``parts`` extra names, installed with it: shard-llava's CLIP and Llama). Static, so it runs in every suite; the
real install-one-plugin run is ``nox -s isolated`` (CI runs it for shard-bert)."""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PLUGINS = sorted(
    p for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").is_file() and not p.name.startswith("_")
)


def _covered(plugin: pathlib.Path) -> set[str]:
    """Short names of the model classes a plugin registers (its ``MODELS``), and of their configs."""
    (package,) = plugin.glob("shard_*/__init__.py")
    spec = importlib.util.spec_from_file_location(f"isolation_{plugin.name}", package)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # cheap by contract: registers locations, imports no model library
    names = set()
    for qualname in module.MODELS:
        cls = qualname.rpartition(".")[2]
        names |= {cls, re.split(r"For|Model|Encoder|LMHead", cls)[0] + "Config"}
    return names - {"Config"}


def _parts(plugin: pathlib.Path) -> set[str]:
    """The sibling plugins a composite plugin's ``parts`` extra names."""
    import tomllib

    extras = tomllib.loads((plugin / "pyproject.toml").read_text())["project"].get("optional-dependencies", {})
    return set(extras.get("parts", []))


@pytest.mark.parametrize("plugin", PLUGINS, ids=[p.name for p in PLUGINS])
def test_plugin_tests_use_no_other_plugins_models(plugin):
    allowed = _parts(plugin)
    others = set().union(*(_covered(p) for p in PLUGINS if p != plugin and p.name not in allowed)) - _covered(plugin)
    assert others, "no other plugin's classes found: the scan is broken"
    used = []
    for test in (plugin / "tests").glob("*.py"):
        words = set(re.findall(r"\b\w+\b", test.read_text()))
        used += [f"{test.name}: {name}" for name in sorted(words & others)]
    assert not used, f"{plugin.name}'s tests need other plugins' models: {used}"


# ---- what a plugin author copies: the public kit only, and tests as lists of cases
OUTSIDE = sorted(p for p in (ROOT / "tests" / "outside").iterdir() if (p / "pyproject.toml").is_file())
#: the families whose test files are lists of the kit's cases (shardcore.testing.suite), nothing of their own
CASE_LISTS = ("shard-bloom", "shard-falcon", "shard-glm")


def private_imports(text: str) -> list[str]:
    """Each place ``text`` reaches a private name of shardcore: ``from shardcore... import _x``, a private
    module on the path (``shardcore._x``, ``shardcore.a._b``), or an attribute ``_x`` of an imported shardcore name."""
    import ast

    found, bound = [], set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "shardcore":
            parts = node.module.split(".")
            found += [f"line {node.lineno}: {node.module}" for p in parts if p.startswith("_")][:1]
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"line {node.lineno}: {node.module}.{alias.name}")
                bound.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "shardcore":
                    if any(p.startswith("_") for p in alias.name.split(".")):
                        found.append(f"line {node.lineno}: {alias.name}")
                    bound.add(alias.asname or "shardcore")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_private_name_scan_sees_each_way_in():
    sample = (
        "from shardcore.checkpoint.safety import _newest_complete\nimport shardcore.sequence._ring\n"
        "from shardcore import sequence\nsequence.overlap._Regather\nfrom shardcore.testing import run_on_ranks\n"
    )
    assert [f.split(":")[0] for f in private_imports(sample)] == ["line 1", "line 2", "line 4"], private_imports(sample)


@pytest.mark.parametrize("plugin", [*PLUGINS, *OUTSIDE], ids=[p.name for p in [*PLUGINS, *OUTSIDE]])
def test_plugin_tests_import_no_private_name_of_shardcore(plugin):
    used = [
        f"{t.name} {where}" for t in sorted((plugin / "tests").glob("*.py")) for where in private_imports(t.read_text())
    ]
    assert not used, f"{plugin.name}'s tests reach private names of shardcore (test those in tests/): {used}"


@pytest.mark.parametrize("plugin", CASE_LISTS)
def test_plugin_test_files_are_lists_of_the_kits_cases(plugin):
    """Each test of the file is a name bound to a :class:`shardcore.testing.Family` method's call on cases:
    no test function of its own, no helper run on the ranks."""
    import ast

    files = sorted((ROOT / "plugins" / plugin / "tests").glob("test_*.py"))
    assert files, plugin
    methods = {"matches", "generates", "saves", "explains", "refuses", "pipelines", "generates_through_stages"}
    for path in files:
        body = ast.parse(path.read_text()).body
        own = [n.name for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
        assert not own, f"{path.name} defines {own}: a case list has no functions (give the kit a case)"
        tests = [n for n in body if isinstance(n, ast.Assign) and n.targets[0].id.startswith("test_")]
        assert tests, f"{path.name} binds no test"
        for node in tests:
            call = node.value
            assert isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute), ast.unparse(node)
            assert call.func.attr in methods, f"{path.name}: {ast.unparse(node)[:80]} is not one of the kit's tests"
