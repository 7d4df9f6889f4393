"""The check at optimize: one block of each kind (and the model's output) before and after sharding."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..distributed.collectives import all_reduce, group_size
from ..inputs import Inputs, evaluating, find_inputs
from ..inputs import device_of as _device
from ..tensor_parallel.vocab_slice import plain, slice_of
from .errors import ShardingCheckError
from .locate import Trace, first_difference, where_raised
from .locate import rel as _rel
from .locate import tolerance as _tolerance

__all__ = ["BlockProbe", "probe_inputs", "sum_found"]

log = logging.getLogger("shardcore")


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple | list):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def _is_cache(value: Any) -> bool:
    """A model library's key/value cache object (transformers' ``Cache``), by what it does."""
    return callable(getattr(value, "get_seq_length", None)) and callable(getattr(value, "update", None))


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, tuple | list):
        return next((t for t in map(_first_tensor, output) if t is not None), None)
    for name in ("logits", "last_hidden_state"):
        if isinstance(getattr(output, name, None), torch.Tensor):
            return getattr(output, name)
    if isinstance(output, dict):
        return next((t for t in map(_first_tensor, output.values()) if t is not None), None)
    return None


def probe_inputs(model: nn.Module, seed: int = 0) -> dict[str, Any] | None:
    """A HuggingFace model's probe input as keyword arguments, ``None`` if it has none (0.1's name;
    :func:`shardcore.inputs.find_inputs` finds any model's)."""
    inputs, _ = find_inputs(model, seed=seed)
    return None if inputs is None or inputs.args else inputs.kwargs


class BlockProbe:
    """The check at optimize (see the module docstring): :meth:`record` before sharding, :meth:`compare` after."""

    def __init__(self, model: nn.Module, blocks: list[tuple[str, nn.Module]], name: str, example=None) -> None:
        self.model, self.name, self.example = model, name, example
        seen: dict[tuple, tuple[str, nn.Module]] = {}
        for path, block in blocks:  # one of each kind: its class and its children's (hybrid layers differ)
            seen.setdefault((type(block), *(type(m) for m in block.children())), (path, block))
        self.blocks = list(seen.values())
        self.kept: dict[str, dict] = {}
        self.output: torch.Tensor | None = None
        self.inputs: Inputs | None = None
        self.traces: dict[str, list] = {}  # {block path: each module's unsharded output, in the order they finish}
        self.skipped: str | None = None
        self.unchecked: list[str] = [] if self.blocks else ["it has no blocks"]  # compared by the output only

    # -- before sharding -----------------------------------------------------------------------

    def record(self) -> None:
        """Run the whole model once (no gradient) keeping each chosen block's inputs, then each block
        forward and backward on them; a model this cannot run is named in a warning (``skipped``)."""
        try:
            self.inputs, why_not = find_inputs(self.model, self.example)
        except Exception as err:
            self.inputs, self.skipped = None, f"no probe input ({type(err).__name__}: {err})"
            return
        if self.inputs is None:
            self.skipped = why_not
            return
        captured: dict[str, tuple] = {}
        handles = []
        for path, block in self.blocks:

            def keep(module, args, kwargs, path=path):
                # a key/value cache the forward made anyway: left out (run again, the block would extend it)
                kwargs = {k: (None if _is_cache(v) else v) for k, v in kwargs.items()}
                captured.setdefault(path, (_clone(args), _clone(kwargs)))

            handles.append(block.register_forward_pre_hook(keep, with_kwargs=True))
        modes = evaluating(self.model)  # every module back in its own mode after
        modes.__enter__()
        try:
            with torch.no_grad():
                self.output = _clone(_first_tensor(self.inputs(self.model)))
            for path, block in self.blocks:
                if path not in captured:
                    self.unchecked.append(f"{path} (the probe input does not reach it)")
                    continue
                try:  # a block that cannot run alone: the output is still compared
                    with Trace(block, path, keep=True) as trace:
                        self.kept[path] = self._run(block, *captured[path])
                    self.traces[path] = trace.outputs
                except Exception as err:
                    self.unchecked.append(f"{path} ({type(err).__name__}: {err})")
        except Exception as err:
            self.skipped = f"{type(err).__name__}: {err}"
            self.kept = {}
        finally:
            for h in handles:
                h.remove()
            modes.__exit__(None, None, None)

    @staticmethod
    def _run(block: nn.Module, args: tuple, kwargs: dict) -> dict:
        args, kwargs = _clone(args), _clone(kwargs)
        x = args[0] if args else kwargs.get("hidden_states")
        if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
            raise TypeError(f"{type(block).__name__}'s first input is not a floating-point tensor")
        x.requires_grad_(True)
        before = {p: p.grad for p in block.parameters()}  # the caller's gradients, put back after
        for p in before:
            p.grad = None
        out = _first_tensor(block(*args, **kwargs))
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
        (out.float() * weights.float()).sum().backward()
        grads = {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in block.named_parameters()}
        for p in block.parameters():
            p.grad = before.get(p)
        return {"args": args, "kwargs": kwargs, "out": out.detach(), "x_grad": x.grad.detach(), "grads": grads}

    # -- after sharding ------------------------------------------------------------------------

    def compare(self, group) -> list[str]:
        """Run the blocks and the model again, sharded; raise :class:`ShardingCheckError` on every rank
        on a difference; return the replicated parameters whose gradient now gets summed."""
        if self.skipped is not None:
            log.warning(
                "shardcore: %s: the block check at optimize did not run (%s); the first-step gradient check still runs",
                self.name,
                self.skipped,
            )
            return []
        if self.unchecked:
            log.warning(
                "shardcore: %s: the block check compares the model's output only for %s",
                self.name,
                "; ".join(self.unchecked)[:500],
            )
        problems: list[str] = []
        summed: list[str] = []
        with evaluating(self.model):
            for path, block in self.blocks:
                if path in self.kept:
                    with Trace(block, path, keep=True) as trace:
                        try:  # every rank runs the same block on the same input: they raise alike
                            found = self._compare_block(path, block, self.kept[path], group, summed)
                        except Exception as err:
                            found = [f"{path} ({type(block).__name__}): {where_raised(trace, err)}"]
                    if found:
                        found += _located(self.traces.get(path, []), trace.outputs, block, path, group)
                    problems += found
            problems += self._compare_output()
        flag = torch.tensor([float(bool(problems))], device=_device(self.model))
        all_reduce(flag, group, op=torch.distributed.ReduceOp.MAX, where="the block check of optimize")
        if flag.item():
            said = "; ".join(problems) if problems else "another rank found a difference (see its error)"
            raise ShardingCheckError(
                f"{self.name}: the sharded model does not compute what the unsharded one did: {said}. "
                "The plan is wrong for this model: fix it (give those parameters or modules other specs), "
                "write a policy, or pass ShardConfig(verify=False) to shard anyway"
            )
        return summed

    def _compare_output(self) -> list[str]:
        """The sharded model's output against the unsharded one's (this rank's vocabulary slice of it
        where the model returns one: ``parallel_output``)."""
        with Trace(self.model) as trace:
            try:
                with torch.no_grad():
                    out = _first_tensor(self.inputs(self.model))
            except Exception as err:
                return [f"the sharded model: {where_raised(trace, err)}"]
        if out is None or self.output is None:
            return []
        expected, mark = self.output, slice_of(out)
        if mark is not None:  # ShardConfig(parallel_output=True): this rank's columns of the logits
            expected, out = expected[..., mark[0] : mark[0] + out.shape[-1]], plain(out)
        err = _rel(out, expected) if out.shape == expected.shape else float("inf")
        if err > _tolerance(out) * 10:
            shapes = f" (shape {tuple(out.shape)}, unsharded {tuple(expected.shape)})" if err == float("inf") else ""
            return [f"the model's output differs from the unsharded one's by {err:.2g} of its largest entry{shapes}"]
        return []

    def _compare_block(self, path: str, block: nn.Module, ref: dict, group, summed: list[str]) -> list[str]:
        from ..sharded_state import parameter_specs

        now = self._run(block, ref["args"], ref["kwargs"])
        what = f"{path} ({type(block).__name__})"
        out_err, in_err = _rel(now["out"], ref["out"]), _rel(now["x_grad"], ref["x_grad"])
        problems = []
        if out_err > _tolerance(ref["out"]):
            problems.append(f"{what}: its output differs by {out_err:.2g}")
        if in_err > _tolerance(ref["x_grad"]):
            problems.append(f"{what}: the gradient of its input differs by {in_err:.2g}")
        specs = parameter_specs(block)
        grads = [g for g in ref["grads"].values() if g is not None]
        floor = 1e-3 * max((g.abs().max().item() for g in grads if g.numel()), default=0.0) or 1e-6
        wrong = []
        for name, expected in ref["grads"].items():  # the same names on every rank: the same collectives
            grad = now["grads"].get(name)
            if expected is None or grad is None:
                continue
            where = f"the block check of optimize ({path}.{name})"
            if name in specs:
                spec, pgroup = specs[name]
                grad, total = spec.gather(grad, pgroup) / _routed_copies(block, name), None
            else:  # replicated: is it this rank's share of the unsharded gradient (then summed from now on)?
                total = all_reduce(grad.clone(), group, where=where)
            if grad.shape != expected.shape:
                continue  # a parameter whose split the gather does not describe: the output checks cover it
            tol = _tolerance(expected)
            if _rel(grad, expected, floor) <= tol:
                continue
            if total is not None and _rel(total, expected, floor) <= tol:
                summed.append(f"{type(block).__name__}.{name}")
            else:
                wrong.append(f"{name} ({_rel(grad, expected, floor):.2g})")
        if wrong:
            problems.append(f"{what}: the gradients of {', '.join(wrong)} differ")
        return problems


def _located(expected: list, got: list, block: nn.Module, path: str, group) -> list[str]:
    """Where a block that differs goes wrong: :func:`~shardcore.verify.locate.first_difference`, as a problem."""
    from ..distributed.collectives import group_rank, group_size
    from ..tensor_parallel import ParallelModule

    skip = {f"{path}.{n}" if n else path for n, m in block.named_modules() if isinstance(m, ParallelModule)}
    where = first_difference(expected, got, skip, group_rank(group), group_size(group))
    return [where] if where else []


def _routed_copies(block: nn.Module, name: str) -> int:
    """How many times an expert-parallel parameter's gradient counts the probe: every rank runs the block on
    the same input and the expert-parallel ranks send it all to the experts (ep copies of each token)."""
    owner = block.get_submodule(name.rpartition(".")[0])
    group = getattr(owner, "ep_group", None) if getattr(owner, "expert_parallel", False) else None
    return 1 if group is None else group_size(group)


def sum_found(model: nn.Module, blocks: list[tuple[str, nn.Module]], found: list[str], group) -> list[str]:
    """Sum over ``group`` the gradients of the replicated parameters the block check found (``Class.param``),
    in every block of that class; return their full names."""
    from ..tensor_parallel import sum_gradients_over_group

    names = []
    for path, block in blocks:
        for name, param in block.named_parameters():
            if f"{type(block).__name__}.{name}" in found:
                names.append(f"{path}.{name}")
                sum_gradients_over_group({names[-1]: param}, group)
    if names:
        log.warning(
            "shardcore: %s are replicated but act on split activations (the block check found their gradients "
            "partial); their gradients are summed over the tensor-parallel group",
            ", ".join(sorted(found)),
        )
    return names
