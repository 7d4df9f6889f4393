"""The core's shape, checked: the import graph of ``shardcore/`` (no cycle, nothing imported from a
higher tier, no private name imported from another subpackage) and its size limits. Static (the
source is parsed, nothing imported), well under a second."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORE = ROOT / "shardcore"

#: The dependency order, bottom-up: a module imports from its own tier or below, never above.
TIERS = [
    [
        "config",
        "config_checks",
        "hookspecs",
        "meta",
        "moved",
        "inputs",
        "spec",
        "attach",
    ],  # moved: the warned re-exports of moved names; inputs: a model's example input; spec: what a policy declares
    ["distributed"],  # groups, the layout and its mesh, bounded + counted collectives, the rank launcher
    ["tensor_parallel"],  # Megatron's mappings and regions, the parallel layers, per-rank random streams
    ["amp", "sequence", "pipeline", "data_parallel", "expert_parallel", "consistency"],
    ["kernels"],  # above the parallelisms: its switches act on their layers and a library's registered attention
    ["policy", "sharded_state", "grad_norm", "grad_mark", "losses", "builders", "plugins", "metrics"],
    ["checkpoint"],
    ["integrations"],
    ["plan", "verify"],  # verify: the checks of plans shardcore did not write
    [
        "sharder",
        "steps",
        "composite",
    ],  # steps: optimize's ordered list; composite: a part's policy found as resolve_policy finds one
    ["inference"],
    ["explain"],
    ["cost"],  # the machine's measured profile (shardcore calibrate), the cost model over explain's counts
    [
        "testing",
        "card",  # shardcore check: the user's layout against the unsharded model, on the kit's comparisons
        "cli",
        "hf",
        "__main__",
        "layers",
        "plugin_api",
        "",
    ],  # "": the package itself; layers: 0.1's paths, deprecated
]

#: Files over the size limit, each to be split; the list may only shrink (and never name a file
#: that has become small enough: it is then removed from here).
OVERSIZED: dict[str, int] = {}
MAX_LINES = 300
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in CORE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> list[tuple[str, str]]:
    """``(module, imported name)`` for every import of a shardcore module in ``path``, at any depth
    (a function-local import is an import too)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "shardcore":
                continue
            for alias in node.names:
                target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                found.append((target, alias.name))
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.split(".")[0] == "shardcore"]
    return found


def _module_of(target: str) -> str:
    while target not in MODULES and "." in target:
        target = target.rsplit(".", 1)[0]
    return target


def _area(module: str) -> str:
    """The top-level subpackage or module of ``module`` (``""`` for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _tier(module: str) -> int:
    area = _area(module)
    for i, names in enumerate(TIERS):
        if area in names:
            return i
    raise AssertionError(f"{module} is in no tier of tests/test_core_architecture.py: place {area!r} in TIERS")


GRAPH = {m: sorted({_module_of(t) for t, _ in _imports(m, p)} - {m}) for m, p in MODULES.items()}


def test_every_import_names_a_module_that_exists():
    """A relative import left pointing at a module that moved (``from .inference`` in a file that
    went one package down) fails only when that line runs: found here, statically."""
    missing = []
    for m, p in MODULES.items():
        for target, name in _imports(m, p):
            if target not in MODULES:
                missing.append(f"{m} imports {name or target} from {target}, which does not exist")
    assert not missing, "\n".join(missing)


def test_every_module_has_a_tier():
    for module in MODULES:
        _tier(module)


def test_nothing_is_imported_from_a_higher_tier():
    upward = [f"{m} -> {t}" for m, targets in GRAPH.items() for t in targets if _tier(t) > _tier(m)]
    assert not upward, "imports up the order (move the code down, or hand it in as an argument):\n" + "\n".join(upward)


def _cycle(graph: dict[str, list[str]] | None = None) -> list[str] | None:
    graph = GRAPH if graph is None else graph
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in graph.get(m, ()):
            if state.get(t) == 1:
                return [*stack[stack.index(t) :], t]
            if t not in state and (found := visit(t)):
                return found
        state[m] = 2
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycle():
    assert _cycle() is None, "import cycle: " + " -> ".join(_cycle() or [])


def _package_graph(graph: dict[str, list[str]]) -> dict[str, list[str]]:
    """The import graph between top-level subpackages (and modules): ``sequence -> kernels`` when any
    module of ``sequence`` imports any of ``kernels``."""
    out: dict[str, set[str]] = {_area(m): set() for m in graph}
    for m, targets in graph.items():
        out[_area(m)] |= {_area(t) for t in targets} - {_area(m)}
    return {a: sorted(ts) for a, ts in out.items()}


def test_no_import_cycle_between_packages():
    """Two subpackages importing each other (each module's imports acyclic, through function-local
    imports) are one package in two folders: found here, though no module cycle exists."""
    cycle = _cycle(_package_graph(GRAPH))
    assert cycle is None, "package-level import cycle: " + " -> ".join(cycle or [])


def test_no_private_name_from_another_subpackage():
    private = [
        f"{m} imports {name} from {_module_of(t)}"
        for m, p in MODULES.items()
        for t, name in _imports(m, p)
        if name.startswith("_") and _area(_module_of(t)) != _area(m)
    ]
    assert not private, "private names crossing subpackages (make them public or move them):\n" + "\n".join(private)


def test_the_checks_see_what_they_claim(tmp_path):
    """The graph is the source's: an upward import, a cycle and a package-level cycle (two modules
    of two subpackages importing each other's other modules) planted in a copy are found."""
    packages = {"shardcore.sequence.hooks": ["shardcore.kernels"], "shardcore.kernels": ["shardcore.sequence.ring"]}
    assert _cycle(packages) is None and _cycle(_package_graph(packages)) == ["kernels", "sequence", "kernels"]
    planted = {"shardcore.config": ["shardcore.sharder"], "shardcore.sharder": ["shardcore.config"]}
    assert any(_tier(t) > _tier(m) for m, ts in planted.items() for t in ts)
    saved = dict(GRAPH)
    try:
        GRAPH.update(planted)
        assert _cycle() is not None
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


def _lines(path: pathlib.Path) -> int:
    return len(path.read_text().splitlines())


@pytest.mark.parametrize("path", sorted(MODULES.values()), ids=lambda p: str(p.relative_to(ROOT)))
def test_file_size(path):
    name = str(path.relative_to(ROOT))
    n = _lines(path)
    if name in OVERSIZED:
        assert n > MAX_LINES, f"{name} is {n} lines now: remove it from OVERSIZED"
        assert n <= OVERSIZED[name], f"{name} grew to {n} lines (allowed {OVERSIZED[name]} until it is split)"
    else:
        assert n <= MAX_LINES, f"{name} is {n} lines, over {MAX_LINES}: split it by concern"


def test_function_size():
    long, seen = [], set()
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    seen.add(f"{path.relative_to(ROOT)}:{node.name}")
                if n > MAX_FUNCTION_LINES and f"{path.relative_to(ROOT)}:{node.name}" not in LONG_FUNCTIONS:
                    long.append(f"{path.relative_to(ROOT)}:{node.name} ({n} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)
    assert not LONG_FUNCTIONS - seen, f"split now, remove from LONG_FUNCTIONS: {sorted(LONG_FUNCTIONS - seen)}"


#: Functions over the limit, each to be split; may only shrink (empty: every function fits).
LONG_FUNCTIONS: set[str] = set()
