"""Plugin discovery, lazy policy resolution, failure reporting and the CLI (no transformers needed)."""

from __future__ import annotations

import importlib.metadata as md
import json
import pathlib
import re
import subprocess
import sys
import types

import pytest
from torch import nn

import shardcore
from shardcore import Policy, hookimpl
from shardcore.cli import main as cli_main
from shardcore.plugins import NoPolicyError, PluginRegistry, qualname

ROOT = pathlib.Path(__file__).resolve().parents[1]


class Widget(nn.Module):
    pass


class SubWidget(Widget):
    pass


class WidgetPolicy(Policy):
    def module_policy(self):
        return {}


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


@pytest.fixture
def fake_entry_points(monkeypatch):
    """Replace the installed entry points of group 'shardcore' by the ones a test lists; other groups
    (triton's backends, which a lazily imported torch._dynamo reads) stay the installed ones."""
    eps: list[md.EntryPoint] = []
    real = md.entry_points

    def entry_points(group=None, **select):
        if group == "shardcore":
            return md.EntryPoints(e for e in eps if e.group == group)
        return real(group=group, **select) if group is not None else real(**select)

    monkeypatch.setattr(md, "entry_points", entry_points)
    return eps


def _good_plugin(location: str) -> types.ModuleType:
    @hookimpl
    def shardcore_register_policies(register):
        register(qualname(Widget), location)

    return _module("fake_good_plugin", shardcore_register_policies=shardcore_register_policies)


def test_discovery_is_lazy_and_matches_subclasses(fake_entry_points, monkeypatch):
    lazy = _module("fake_lazy_policy_module", WidgetPolicy=WidgetPolicy)
    monkeypatch.setitem(sys.modules, "fake_good_plugin", _good_plugin("fake_lazy_policy_module:WidgetPolicy"))
    fake_entry_points.append(md.EntryPoint("good", "fake_good_plugin", "shardcore"))
    registry = PluginRegistry().load()
    assert registry.plugins["good"].error is None
    assert registry.plugins["good"].models == [qualname(Widget)]
    # the policy module is imported only now, when a covered model (a subclass here) asks for it
    monkeypatch.setitem(sys.modules, "fake_lazy_policy_module", lazy)
    assert isinstance(registry.get_policy(SubWidget()), WidgetPolicy)


def test_broken_plugin_is_reported_and_skipped(fake_entry_points, monkeypatch):
    monkeypatch.setitem(sys.modules, "fake_good_plugin", _good_plugin(f"{__name__}:WidgetPolicy"))
    boom = _module("fake_boom")

    def fail_register(register):
        raise RuntimeError("registration exploded")

    boom.shardcore_register_policies = hookimpl(fail_register)
    monkeypatch.setitem(sys.modules, "fake_boom", boom)
    fake_entry_points += [
        md.EntryPoint("missing", "fake_module_that_does_not_exist", "shardcore"),
        md.EntryPoint("boom", "fake_boom", "shardcore"),
        md.EntryPoint("good", "fake_good_plugin", "shardcore"),
    ]
    registry = PluginRegistry().load()
    assert "import failed: ModuleNotFoundError" in registry.plugins["missing"].error
    assert "registration exploded" in registry.plugins["boom"].error
    assert registry.plugins["good"].error is None
    assert isinstance(registry.get_policy(Widget()), WidgetPolicy)


def test_misspelt_hook_is_an_error(fake_entry_points, monkeypatch):
    @hookimpl
    def shardcore_register_policy(register):  # missing "s"
        pass

    monkeypatch.setitem(
        sys.modules, "fake_typo", _module("fake_typo", shardcore_register_policy=shardcore_register_policy)
    )
    fake_entry_points.append(md.EntryPoint("typo", "fake_typo", "shardcore"))
    registry = PluginRegistry().load()
    assert "shardcore_register_policy" in registry.plugins["typo"].error


def test_disable_plugins_env(fake_entry_points, monkeypatch):
    monkeypatch.setitem(sys.modules, "fake_good_plugin", _good_plugin(f"{__name__}:WidgetPolicy"))
    fake_entry_points.append(md.EntryPoint("good", "fake_good_plugin", "shardcore"))
    monkeypatch.setenv("SHARDCORE_DISABLE_PLUGINS", "other, good")
    registry = PluginRegistry().load()
    assert "good" not in registry.plugins, f"SHARDCORE_DISABLE_PLUGINS='other, good' left {sorted(registry.plugins)}"
    with pytest.raises(NoPolicyError):
        registry.get_policy(Widget())


def test_no_policy_error_names_class_plugins_and_fix(fake_entry_points, monkeypatch):
    monkeypatch.setitem(sys.modules, "fake_good_plugin", _good_plugin(f"{__name__}:WidgetPolicy"))
    fake_entry_points += [
        md.EntryPoint("good", "fake_good_plugin", "shardcore"),
        md.EntryPoint("missing", "fake_module_that_does_not_exist", "shardcore"),
    ]
    registry = PluginRegistry().load()
    with pytest.raises(NoPolicyError) as err:
        registry.get_policy(nn.Linear(2, 2))
    msg = str(err.value)
    assert "torch.nn.modules.linear.Linear" in msg
    assert "good (Widget)" in msg
    assert "'missing' failed to load" in msg
    assert "pip install shard-" in msg and "policy=" in msg


def test_register_and_unregister_a_plugin_object():
    class InlinePlugin:
        @hookimpl
        def shardcore_register_policies(self, register):
            register(qualname(Widget), WidgetPolicy)

    registry = PluginRegistry().load()
    registry.register(InlinePlugin(), name="inline")
    assert isinstance(registry.get_policy(Widget()), WidgetPolicy)
    registry.unregister("inline")
    assert registry.find(Widget) is None


def test_bad_policy_location_is_reported(fake_entry_points, monkeypatch):
    monkeypatch.setitem(sys.modules, "fake_good_plugin", _good_plugin("fake_nowhere.module:Policy"))
    fake_entry_points.append(md.EntryPoint("good", "fake_good_plugin", "shardcore"))
    registry = PluginRegistry().load()
    with pytest.raises(ImportError, match=re.escape("plugin 'good' registered policy 'fake_nowhere.module:Policy'")):
        registry.get_policy(Widget())


def test_cli_table_and_json(fake_entry_points, monkeypatch, capsys):
    import shardcore.plugins as plugins

    monkeypatch.setitem(sys.modules, "fake_good_plugin", _good_plugin(f"{__name__}:WidgetPolicy"))
    fake_entry_points += [
        md.EntryPoint("good", "fake_good_plugin", "shardcore"),
        md.EntryPoint("missing", "fake_module_that_does_not_exist", "shardcore"),
    ]
    monkeypatch.setattr(plugins, "_REGISTRY", None)
    code = cli_main(["plugins"])  # a plugin that cannot be imported: a non-zero exit
    assert code == 1, f"shardcore plugins exited {code} with a plugin that cannot be imported"
    out = capsys.readouterr()
    table = out.out
    assert "good" in table and "Widget" in table and "FAILED" in table and "ModuleNotFoundError" in out.err
    assert cli_main(["plugins", "--json"]) == 1
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["good"]["models"] == [qualname(Widget)] and rows["good"]["error"] is None
    assert rows["missing"]["error"].startswith("import failed")
    monkeypatch.setattr(plugins, "_REGISTRY", None)


def test_import_and_discovery_do_not_import_model_libraries():
    """`import shardcore`, the plugin-author API, plugin discovery and `shardcore plugins` never import
    transformers or timm, nor torch's compiler (``torch._dynamo``: about 3 s of CPU here) or DTensor
    (``torch.distributed.tensor``: about 1 s), which only compiling and FSDP need
    (``benchmarks/bench_startup.py`` measures what is left)."""
    code = (
        "import sys, shardcore, shardcore.plugin_api\n"
        "from shardcore.plugins import get_registry\n"
        "from shardcore.cli import main\n"
        "reg = get_registry()\n"
        "main(['plugins'])\n"
        "heavy = [m for m in ('transformers', 'timm', 'torch._dynamo', 'torch.distributed.tensor') if m in sys.modules]\n"
        "print('HEAVY', ', '.join(heavy))\n"
        "print('PLUGINS', sorted(reg.plugins))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "PLUGINS" in out.stdout
    (heavy,) = [line.removeprefix("HEAVY").strip() for line in out.stdout.splitlines() if line.startswith("HEAVY")]
    assert not heavy, f"imported by a fresh import of shardcore: {heavy}"


def test_optimize_without_plugin_or_policy_fails_clearly(fake_entry_points, monkeypatch):
    import shardcore.plugins as plugins

    monkeypatch.setattr(plugins, "_REGISTRY", None)
    with pytest.raises(
        NoPolicyError, match=r"(?s)No shardcore policy covers .*Widget.*No shardcore plugin is installed"
    ):
        shardcore.optimize(Widget())
    monkeypatch.setattr(plugins, "_REGISTRY", None)


def test_zero_config_fallback_names_a_broken_plugin(fake_entry_points, monkeypatch):
    """A plugin that fails to import is no silent fallback: a model no loaded plugin covers is
    sharded by its shipped plan with a RuntimeWarning naming the broken plugin and its error."""
    import transformers

    import shardcore.plugins as plugins
    from shardcore import resolve_policy

    fake_entry_points.append(md.EntryPoint("shard-broken", "fake_module_that_does_not_exist", "shardcore"))
    monkeypatch.setattr(plugins, "_REGISTRY", None)
    config = transformers.Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, head_dim=16
    )
    with pytest.warns(
        RuntimeWarning, match="the plugin 'shard-broken' failed to load \\(import failed: ModuleNotFound"
    ):
        policy = resolve_policy(transformers.Qwen3ForCausalLM(config))
    assert type(policy).__name__ == "ShippedPlanPolicy"
    monkeypatch.setattr(plugins, "_REGISTRY", None)


def test_core_sdist_holds_the_core_and_the_license(tmp_path):
    """The core's source distribution: the package, its README, the Apache-2.0 LICENSE it declares;
    no plugin, benchmark or CI file (each plugin is its own distribution)."""
    import pathlib
    import tarfile

    from hatchling.builders.sdist import SdistBuilder

    root = pathlib.Path(__file__).resolve().parents[1]
    assert (
        "Apache License" in (root / "LICENSE").read_text()
        and "Version 2.0, January 2004" in (root / "LICENSE").read_text()
    )
    (path,) = SdistBuilder(str(root)).build(directory=str(tmp_path), versions=["standard"])
    with tarfile.open(path) as sdist:
        top = {name.split("/")[1] for name in sdist.getnames() if name.count("/")}
        info = sdist.extractfile(next(n for n in sdist.getnames() if n.endswith("/PKG-INFO"))).read().decode()
    assert top <= {"shardcore", "README.md", "LICENSE", "pyproject.toml", "PKG-INFO", ".gitignore"}, top
    assert {"shardcore", "LICENSE"} <= top
    assert "License-Expression: Apache-2.0" in info and "License-File: LICENSE" in info
    # the long description: every link absolute (an index page has no docs/ beside it)
    relative = re.findall(r"\]\((?!https?://|#)[^)]*\)", info)
    assert not relative and "Description-Content-Type: text/markdown" in info, relative


def test_plugin_readmes_link_nowhere_relative():
    """A plugin's README is its long description on an index page: no relative link."""
    import pathlib

    for readme in (pathlib.Path(__file__).resolve().parents[1] / "plugins").glob("*/README.md"):
        assert not re.findall(r"\]\((?!https?://|#)[^)]*\)", readme.read_text()), readme


def test_the_bundled_plugins_import_only_shardcore_and_its_plugin_api():
    """A bundled plugin is written the way a third party must write one: every import from shardcore,
    at the top of a module or inside a function, is from ``shardcore`` or ``shardcore.plugin_api``; and
    every name it takes from ``shardcore`` itself is public there (so the API covers what a family needs)."""
    import ast
    import pathlib

    import shardcore.plugin_api as api

    root = pathlib.Path(__file__).resolve().parents[1] / "plugins"
    seen, elsewhere = set(), []
    for path in [*root.glob("shard-*/shard_*/**/*.py"), *root.glob("_template/shard_*/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import) and any(a.name.startswith("shardcore.") for a in node.names):
                elsewhere.append(f"{path.relative_to(root)}:{node.lineno}: import {node.names[0].name}")
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("shardcore"):
                if node.module not in ("shardcore", "shardcore.plugin_api"):
                    elsewhere.append(f"{path.relative_to(root)}:{node.lineno}: from {node.module}")
                seen |= {(node.module, a.name) for a in node.names}
    assert not elsewhere, "import these from shardcore.plugin_api:\n" + "\n".join(elsewhere)
    assert len(seen) > 30, seen
    for module, name in sorted(seen):
        public = api.__all__ if module == "shardcore.plugin_api" else shardcore.__all__
        assert name in public, f"{module}.{name} (imported by a plugin) is not in {module}.__all__"


BUNDLED = sorted(p.name.removeprefix("shard-") for p in (ROOT / "plugins").glob("shard-*") if p.is_dir())


@pytest.mark.parametrize("name", BUNDLED)
def test_each_bundled_plugin_covers_its_models(name):
    """The installed entry point's hook registers every class of the plugin's ``MODELS``, to that
    plugin (a model that zero-config could shard too must still get the plugin's policy)."""
    import importlib

    module = importlib.import_module(f"shard_{name}")
    registry = PluginRegistry().load()
    assert name in registry.plugins, f"no installed plugin named {name!r}: {sorted(registry.plugins)}"
    missing = [q for q in module.MODELS if getattr(registry.entries.get(q), "plugin", None) != name]
    assert not missing, f"shard-{name}'s hook left {len(missing)} of its {len(module.MODELS)} models unregistered"
