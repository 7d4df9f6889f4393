"""The seams with PyTorch and the model libraries, checked statically (the source is parsed):

* every call of ``torch.distributed``'s communication (collectives, point-to-point, object
  collectives, barriers, group creation) is in ``shardcore/distributed/``, the bounded, counted door;
  nowhere else in the core or in a plugin's package;
* no module attribute of ``torch``, ``transformers`` or ``peft`` is assigned (``torch.x = ...``,
  ``setattr(torch.y, ...)``): a patch would outlive the model that made it, and every other model of
  the process would run through it.

Tests may patch (pytest's ``monkeypatch`` undoes it); the packages may not.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from shardcore.testing.refusals import C10D_CALLS

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: what calls torch.distributed's communication: the package that bounds and counts it
DOOR = ROOT / "shardcore" / "distributed"
COMMUNICATION = frozenset(C10D_CALLS) | {
    "isend",
    "irecv",
    "batch_isend_irecv",
    "send_object_list",
    "recv_object_list",
    "gather_object",
    "scatter_object_list",
    "new_subgroups",
    "init_process_group",
}
PATCHED_ROOTS = ("torch", "transformers", "peft")
#: ``file: reason`` of the assignments into those libraries still made, each to be removed: none
#: is left (clipping's routing became a mark on the gradients, ``shardcore/grad_mark.py``)
KNOWN_PATCHES: dict[str, str] = {}


def _sources() -> list[pathlib.Path]:
    core = sorted((ROOT / "shardcore").rglob("*.py"))
    plugins = sorted(p for p in (ROOT / "plugins").glob("shard-*/shard_*/**/*.py"))
    return core + plugins


def _aliases(tree: ast.AST) -> tuple[dict[str, str], dict[str, str]]:
    """``(module aliases, imported functions)``: ``{"dist": "torch.distributed", ...}`` and
    ``{"all_reduce": "torch.distributed.all_reduce", ...}`` for the imports of ``tree``."""
    modules, functions = {}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                modules[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if node.module.split(".")[0] in PATCHED_ROOTS and a.name[:1].islower():
                    modules[a.asname or a.name] = full  # a submodule (``from torch import nn``) or a function
                functions[a.asname or a.name] = full
    return modules, functions


def _dotted(node: ast.AST, modules: dict[str, str]) -> str | None:
    """``torch.distributed.all_reduce`` for ``dist.all_reduce`` (``dist`` an alias of a module), else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in modules:
        return None
    return ".".join([modules[node.id], *reversed(parts)])


def _communication_calls(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    modules, functions = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = _dotted(func, modules) if isinstance(func, ast.Attribute) else None
        if isinstance(func, ast.Name):
            name = functions.get(func.id)
        if name and name.startswith("torch.distributed.") and name.rsplit(".", 1)[1] in COMMUNICATION:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return found


def _patches(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    modules, _ = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            targets = node.args[:1]  # the object whose attribute is set
            if targets and isinstance(targets[0], ast.Name) and targets[0].id not in modules:
                targets = []
        for target in targets:
            name = _dotted(target, modules) if isinstance(target, (ast.Attribute, ast.Name)) else None
            if name and name.split(".")[0] in PATCHED_ROOTS:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return found


def test_no_communication_outside_the_distributed_package():
    outside = [c for p in _sources() if DOOR not in p.parents for c in _communication_calls(p)]
    assert not outside, (
        "torch.distributed called outside shardcore/distributed (use its bounded, counted functions: "
        "collectives.py, objects.py):\n" + "\n".join(outside)
    )


def test_nothing_of_torch_transformers_or_peft_is_patched():
    found = {}
    for path in _sources():
        for patch in _patches(path):
            found.setdefault(patch.split(":")[0], []).append(patch)
    unknown = {f: p for f, p in found.items() if f not in KNOWN_PATCHES}
    assert not unknown, "assignments into torch / transformers / peft:\n" + "\n".join(
        p for ps in unknown.values() for p in ps
    )
    gone = set(KNOWN_PATCHES) - set(found)
    assert not gone, f"no patch left in {sorted(gone)}: remove it from KNOWN_PATCHES"


@pytest.mark.parametrize(
    ("source", "kind", "expected"),
    [
        ("import torch.distributed as dist\ndist.all_reduce(x)\n", "call", "torch.distributed.all_reduce"),
        ("from torch.distributed import send\nsend(x, 1)\n", "call", "torch.distributed.send"),
        ("import torch\ntorch.distributed.barrier()\n", "call", "torch.distributed.barrier"),
        ("import torch.distributed as dist\ndist.get_rank()\n", "call", None),
        ("import torch\ntorch.nn.utils.get_total_norm = f\n", "patch", "torch.nn.utils.get_total_norm"),
        (
            "from torch.nn.utils import clip_grad\nclip_grad._get_total_norm = f\n",
            "patch",
            "torch.nn.utils.clip_grad._get_total_norm",
        ),
        ("import torch.distributed as dist\nsetattr(dist, 'barrier', f)\n", "patch", "torch.distributed"),
        ("import transformers\nsetattr(transformers.models.x, 'f', g)\n", "patch", "transformers.models.x"),
        ("module = object()\nmodule.f = g\n", "patch", None),
    ],
)
def test_the_checks_see_what_they_claim(tmp_path, source, kind, expected):
    """Each form the checks claim to find is found in a planted file, and an innocent one is not."""
    path = ROOT / "shardcore" / f"_planted_{tmp_path.name}.py"
    path.write_text(source)
    try:
        found = _communication_calls(path) if kind == "call" else _patches(path)
    finally:
        path.unlink()
    assert [f.split(" ", 1)[1] for f in found] == ([expected] if expected else []), found


def _torch_s_norm_beside_a_sharded_model() -> dict:
    import torch
    import torch.distributed as dist
    from toy_models import ToyLM, ToyPolicy

    import shardcore
    from shardcore import ShardConfig, grad_norm

    clip_grad, utils = torch.nn.utils.clip_grad, torch.nn.utils
    functions = (clip_grad._get_total_norm, clip_grad.clip_grad_norm_, utils.get_total_norm, utils.clip_grad_norm_)
    torch.manual_seed(0)
    plain = ToyLM(vocab=128)
    model = shardcore.optimize(
        ToyLM(vocab=128), ShardConfig(tensor_parallel_size=dist.get_world_size()), policy=ToyPolicy
    )
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    for m in (plain, model):
        m(ids, labels=ids)["loss"].backward()
    grads = [p.grad for p in plain.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer.step()
    seen = _marked_grad_as_users_handle_it([p.grad for p in model.parameters()])
    return seen | {
        "torch's functions unchanged": functions
        == (clip_grad._get_total_norm, clip_grad.clip_grad_norm_, utils.get_total_norm, utils.clip_grad_norm_),
        "sharded gradients": sorted({type(p.grad).__name__ for p in model.parameters()}),
        "plain gradients": sorted({type(g).__name__ for g in grads}),
        "plain norm": (utils.get_total_norm(grads) - torch.stack([g.norm() for g in grads]).norm()).abs().item(),
        "sharded norm": (
            utils.get_total_norm([p.grad for p in model.parameters()]) - grad_norm.grad_norm(model)
        ).item(),
        "sharded norm, foreach": (
            utils.get_total_norm([p.grad for p in model.parameters()], foreach=True) - grad_norm.grad_norm(model)
        ).item(),
        "optimizer state": sorted({type(v).__name__ for st in optimizer.state.values() for v in st.values()}),
    }


def _marked_grad_as_users_handle_it(grads: list) -> dict:
    """A marked gradient copied, saved, its norm kept for logging, a norm of norms of another order."""
    import copy
    import gc
    import io

    import torch

    from shardcore.grad_mark import ShardGrad

    g = grads[0]
    copied, buffer = copy.deepcopy(g), io.BytesIO()
    torch.save(g, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)  # weights_only, torch's default: no shardcore class in the file
    local = [torch.linalg.vector_norm(x.as_subclass(torch.Tensor)) for x in grads]
    kept = torch.linalg.vector_norm(torch.ones(3).as_subclass(ShardGrad))  # a logged norm of a gradient gone since
    gc.collect()
    return {
        "copied": [
            type(copied).__name__,
            type(loaded).__name__,
            bool(torch.equal(copied, g) and torch.equal(loaded, g)),
        ],
        "inf of 2-norms": abs(
            torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x) for x in grads]), float("inf")).item()
            - torch.stack(local).max().item()
        ),
        "a kept norm keeps its gradient": kept._grads[0]() is not None,
    }


def test_torch_s_own_norm_is_never_replaced():
    """No patch: torch's gradient-norm functions stay torch's while a sharded model lives; the
    sharded model's gradients carry the mark that makes torch's norm the unsharded one (grad_mark),
    another model's gradients stay plain and get torch's norm as ever, and optimizer state made from
    a marked gradient is a plain tensor (it saves and loads without shardcore)."""
    from shardcore.testing import run_on_ranks

    for seen in run_on_ranks(2, _torch_s_norm_beside_a_sharded_model):
        assert seen["torch's functions unchanged"], seen
        assert seen["sharded gradients"] == ["ShardGrad"], f"a sharded model's gradient without its mark: {seen}"
        assert seen["plain gradients"] == ["Tensor"] and seen["plain norm"] < 1e-6, seen
        assert abs(seen["sharded norm"]) < 1e-6, f"torch's norm of marked gradients is not the unsharded one: {seen}"
        assert abs(seen["sharded norm, foreach"]) < 1e-6, f"torch's foreach norm of marked gradients differs: {seen}"
        assert seen["optimizer state"] == ["Tensor"], f"optimizer state made from a marked gradient: {seen}"
        assert seen["copied"] == ["Tensor", "Tensor", True], f"a marked gradient copied or saved: {seen}"
        assert seen["inf of 2-norms"] < 1e-6, f"a norm of norms of another order is not torch's: {seen}"
        assert not seen["a kept norm keeps its gradient"], f"a norm kept for logging holds its gradient: {seen}"
