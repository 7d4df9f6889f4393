"""Sessions: ``tests``, ``lint``, ``demo``, ``bench``.

Every session runs in ONE shared virtual environment (``.nox/shared``, or ``$SHARDCORE_NOX_ENV``)
so a fresh machine builds the heavy PyTorch environment once per run, not once per session.
Third-party requirements are installed when the environment is created or when a
``pyproject.toml`` or this file changes (a stamp records their hash); shardcore and the plugins
themselves are re-installed from this checkout, as wheels, at the start of every session.

    nox -s tests                        # the whole suite (core + every plugin)
    nox -s tests -- plugins/shard-llama # one package's tests
    nox -s demo                         # Llama sharded over 2 CPU processes vs unsharded
    nox -s bench                        # shardcore TP vs PyTorch TP vs unsharded
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import sys

import nox

ROOT = pathlib.Path(__file__).resolve().parent
PLUGINS = sorted(p for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").is_file())
ENV = pathlib.Path(os.environ.get("SHARDCORE_NOX_ENV", ROOT / ".nox" / "shared"))
BIN = ENV / ("Scripts" if os.name == "nt" else "bin")

# PyTorch's CPU build (this pin is served from local disk on our machines; any 2.4+ works).
TORCH = os.environ.get("SHARDCORE_TORCH", "torch==2.13.0")
TOOLS = ["pytest>=8", "ruff>=0.6", "hatchling>=1.21", "tqdm"]

nox.options.sessions = ["lint", "tests"]
nox.options.default_venv_backend = "none"


def _stamp() -> str:
    files = [ROOT / "noxfile.py", ROOT / "pyproject.toml", *(p / "pyproject.toml" for p in PLUGINS)]
    digest = hashlib.sha256(TORCH.encode())
    for f in files:
        digest.update(f.read_bytes())
    return digest.hexdigest()


def _install(session: nox.Session) -> None:
    """Create (or reuse) the shared environment, then install this checkout's packages into it."""
    stamp = ENV / ".shardcore-stamp"
    pip = [str(BIN / "python"), "-m", "pip", "install", "--quiet"]
    if not stamp.is_file() or stamp.read_text() != _stamp():
        if ENV.exists():
            shutil.rmtree(ENV)
        session.run(sys.executable, "-m", "venv", str(ENV), external=True)
        session.run(*pip, TORCH, external=True)
        # the third-party requirements of the core and every plugin, from their metadata
        session.run(*pip, *TOOLS, str(ROOT), *map(str, PLUGINS), external=True)
        stamp.write_text(_stamp())
    session.run(
        *pip, "--no-deps", "--no-build-isolation", "--force-reinstall", str(ROOT), *map(str, PLUGINS), external=True
    )


def _run(session: nox.Session, tool: str, *args: str, **env: str) -> None:
    session.run(str(BIN / tool), *args, external=True, env={"PYTHONHASHSEED": "0", **env})


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite on real multi-process gloo groups (CPU)."""
    _install(session)
    _run(session, "pytest", *(session.posargs or ["tests", *(str(p / "tests") for p in PLUGINS)]))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format check."""
    _install(session)
    _run(session, "ruff", "check", ".")
    _run(session, "ruff", "format", "--check", ".")


@nox.session
def demo(session: nox.Session) -> None:
    """A small Llama trained a few steps sharded over 2 CPU processes beside the unsharded model."""
    _install(session)
    _run(
        session,
        "torchrun",
        "--standalone",
        "--nproc_per_node",
        "2",
        "examples/llama_tp_demo.py",
        *session.posargs,
        OMP_NUM_THREADS="1",
    )


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmark (not a test): step time, parameter bytes, collectives; writes bench-results/*.json."""
    _install(session)
    _run(session, "python", "benchmarks/bench_llama_tp.py", *session.posargs)
