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
