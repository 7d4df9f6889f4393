"""A plugin from outside, as a third party publishes one: built as a wheel into a temporary index with
shardcore's own wheel, installed into a fresh environment, and its tests run there.

The plugin (``tests/outside/shard-neox``: GPT-NeoX, a family no bundled plugin covers) brings its own hook
placed by declared constraints, its own plan style (an entry point, loaded when a plan names it), a
pipeline spec and a sequence spec, its own mutants and its tests as a list of cases for the kit; nothing
under ``shardcore/`` names it. The fresh environment holds the two wheels; torch, transformers and pytest
come from the test environment through a path file (a copy of PyTorch per test run would take minutes),
without the core or any bundled plugin.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "tests" / "outside" / "shard-neox"
#: what names the plugin: none of it may appear under shardcore/
NAMES = re.compile(r"neox|shard_neox|neox_qkv|neox_context", re.IGNORECASE)


def _run(*cmd, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{(done.stdout + done.stderr)[-6000:]}"
    return done


def _dependencies(into: pathlib.Path) -> None:
    """Links to everything the test environment installed but shardcore and its plugins."""
    into.mkdir()
    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        name = entry.name.lower()
        if name.startswith(("shardcore", "shard_", "shard-", "__editable__")) or name.endswith(".pth"):
            continue
        (into / entry.name).symlink_to(entry)


def test_an_outside_plugin_from_its_wheel_in_a_fresh_environment(tmp_path):
    index, fresh, run = tmp_path / "index", tmp_path / "fresh", tmp_path / "run"
    python = [sys.executable, "-m", "pip"]
    _run(*python, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(index), str(ROOT), str(PLUGIN))
    assert sorted(p.name.split("-")[0] for p in index.glob("*.whl")) == ["shard_neox", "shardcore"], list(
        index.iterdir()
    )
    _run(sys.executable, "-m", "venv", "--without-pip", str(fresh))
    fresh_python = fresh / "bin" / "python"
    _run(*python, "--python", str(fresh_python), "install", "--quiet", "--no-deps", "--no-index",
         "--find-links", str(index), "shardcore", "shard-neox")  # fmt: skip
    _dependencies(tmp_path / "deps")
    purelib = _run(fresh_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    pathlib.Path(purelib, "test_dependencies.pth").write_text(f"{tmp_path / 'deps'}\n")
    shutil.copytree(PLUGIN / "tests", run)  # outside the repository: its conftest and sources are not on the path
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "SHARDCORE_MARGINS")}
    where = _run(fresh_python, "-c", "import shardcore, shard_neox; print(shardcore.__file__, shard_neox.__file__)",
                 cwd=run, env=env).stdout.split()  # fmt: skip
    assert all(pathlib.Path(p).is_relative_to(fresh) for p in where), f"not the installed wheels: {where}"
    done = subprocess.run(
        [fresh_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", "."],
        capture_output=True, text=True, timeout=1500, cwd=run, env=env,
    )  # fmt: skip
    summary = (done.stdout + done.stderr)[-8000:]
    assert done.returncode == 0, f"the outside plugin's tests, from its wheel in a fresh environment:\n{summary}"
    assert re.search(r"\b10 passed\b", summary), summary


def test_nothing_under_shardcore_names_the_outside_plugin():
    named = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "shardcore").rglob("*")
        if p.is_file() and p.suffix in (".py", ".toml", ".txt", ".md") and NAMES.search(p.read_text())
    ]
    assert not named, f"the core names the outside plugin: {named}"
