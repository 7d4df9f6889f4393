"""The conformance check for saving with HuggingFace's own call: ``model.save_pretrained(d)`` on a
sharded model, on every rank, writes the checkpoint ``from_pretrained`` loads unsharded."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .clipping import _sharded_backward
from .compare import _check_outputs, _loss, snapshot
from .steps import step_bound, update_size
from .tolerance import OUTPUT, STEP, within

__all__ = ["assert_save_pretrained_matches"]


def assert_save_pretrained_matches(
    build: Callable[[], nn.Module],
    batch: Mapping[str, Any],
    config,
    path: str,
    *,
    main_process_flag: bool = True,
    policy=None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    seed: int = 0,
    lr: float = 0.1,
    rtol_step: float = STEP.rtol,
    rtol_out: float = OUTPUT.rtol,
) -> dict[str, Any]:
    """Train a sharded model one SGD step, ``model.save_pretrained(path)`` on every rank (with
    ``is_main_process=(rank == 0)`` when ``main_process_flag``, else HF's default), then
    ``from_pretrained(path)`` unsharded on every rank: every tensor must equal the unsharded model
    trained the same step (``rtol_step`` of the step's own size) and so must every output
    (``rtol_out`` of its own size; :mod:`.tolerance`). Run on every rank."""
    import shardcore

    torch.manual_seed(seed)
    ref = build()
    torch.manual_seed(seed)
    model = shardcore.optimize(build(), config, policy=policy)
    _loss(ref(**batch), loss_fn).backward()
    _sharded_backward(model, batch, loss_fn)
    before = snapshot(ref)
    for opt in (torch.optim.SGD(ref.parameters(), lr=lr), torch.optim.SGD(model.parameters(), lr=lr)):
        opt.step()
    kwargs = {"is_main_process": dist.get_rank() == 0} if main_process_flag else {}
    model.save_pretrained(path, **kwargs)
    loaded = type(ref).from_pretrained(path).float().eval()
    ref.eval()
    report: dict[str, Any] = {"tensors": 0, "max_abs_diff_tensors": 0.0}
    want = ref.state_dict()
    # the step's own size (buffers do not move): a tensor saved untrained is off by all of it
    bound = step_bound(update_size(dict(ref.named_parameters()), before), rtol_step)
    for name, tensor in loaded.state_dict().items():
        if name not in want or tensor.shape != want[name].shape:
            raise AssertionError(f"from_pretrained: {name} {tuple(tensor.shape)} is not the unsharded model's")
        diff = (tensor - want[name]).abs().max().item() if tensor.numel() else 0.0
        message = f"{name} loaded from save_pretrained differs from the unsharded model by {diff:.3g} > {bound:.3g}"
        within("step", diff, bound, message)
        report["tensors"] += 1
        report["max_abs_diff_tensors"] = max(report["max_abs_diff_tensors"], diff)
    with torch.no_grad():
        what = " of the model loaded from save_pretrained"
        report["max_abs_diff_outputs"] = _check_outputs(ref(**batch), loaded(**batch), (), rtol_out, what=what)
    return report
