"""Ranks of one tensor-parallel group must agree: same inputs, same random draws, same calls.

:func:`install` (called by :func:`shardcore.optimize` on a sharded model) adds three guards:

* **inputs**: a forward pre-hook on the model digests every tensor argument (ids, labels,
  pixel values, input features, masks: a position-weighted sum of their bytes, exact integer
  arithmetic, plus name, shape and dtype) and all-gathers one pair of int64 per rank over the
  group. Inputs that differ between ranks raise :class:`InputMismatch` on every rank, naming the
  input and which ranks hold which version, before the model computes anything with them. By
  default (:class:`InputGate`) the first forward is checked, and every forward whose inputs'
  names, shapes or dtypes differ from the previous forward's: the steady state of a training loop
  (same shapes each step) pays no collective and no host sync. ``check_inputs="always"`` checks
  every forward (a device-to-host read and a small all-gather each); ``False`` never.
  ``generate`` checks its own arguments once at entry and not each step's forward (those inputs
  derive from the checked ones and the synced draws).
* **sampling**: ``generate`` first makes the group's random state equal to its first rank's
  (one broadcast of the generator state per ``generate`` call), so ``do_sample=True`` draws the
  same tokens on every rank whatever each rank was seeded with.
* **where a collective waits**: hooks record which parallel module a collective comes from, so a
  collective that outlives the bound (:func:`shardcore.distributed.collectives.set_collective_timeout`) names
  its layer, forward or backward, and sequence number.
"""

from __future__ import annotations

import functools
import zlib

import torch
from torch import nn

from .attach import attached
from .attach.stage import in_stage
from .config import ShardConfig
from .distributed.collectives import all_gather_cat, broadcast, current_scope, group_device, group_ranks
from .distributed.objects import all_gather_object
from .distributed.traced import compiling
from .tensor_parallel.parallel_module import ParallelModule

__all__ = ["InputGate", "InputMismatch", "check_inputs", "input_digests", "install", "sync_random_state"]

_MASK = (1 << 63) - 1


class InputMismatch(ValueError):
    """The ranks of one tensor-parallel group were given different inputs."""


def _content_digest(t: torch.Tensor) -> int:
    """A position-sensitive checksum of ``t``'s bytes (exact: integer arithmetic wrapping at 2**64)."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
    n = raw.numel()
    words = raw[: n - n % 8].view(torch.int64)
    tail = raw[n - n % 8 :].to(torch.int64)
    total = 0
    for part in (words, tail):
        if part.numel():
            index = torch.arange(1, part.numel() + 1, dtype=torch.int64, device=part.device)
            total = total * 1_000_003 + int((part * (index * 2_654_435_761 + 1)).sum().item())
    return total & _MASK


def input_digests(args: tuple, kwargs: dict) -> dict[str, tuple[str, int]]:
    """``{input name: (description, digest)}`` for every tensor argument (positional ones as ``arg<i>``)."""
    named = {f"arg{i}": a for i, a in enumerate(args)}
    named.update(kwargs)
    out = {}
    for name, value in named.items():
        if isinstance(value, torch.Tensor):
            meta = f"shape {list(value.shape)}, {str(value.dtype).removeprefix('torch.')}"
            out[name] = (meta, (zlib.crc32(f"{name}|{meta}".encode()) * 1_000_003 + _content_digest(value)) & _MASK)
    return out


def _combined(digests: dict[str, tuple[str, int]], device: torch.device) -> torch.Tensor:
    total = 0
    for name in sorted(digests):
        total = (total * 1_000_003 + zlib.crc32(name.encode()) + digests[name][1]) & _MASK
    return torch.tensor([[len(digests), total]], dtype=torch.int64, device=device)


def _mismatch_message(model_name: str, tables: list[dict[str, tuple[str, int]]], ranks: list[int]) -> str:
    problems = []
    for name in sorted({n for table in tables for n in table}):
        versions: dict[object, list[int]] = {}
        for rank, table in zip(ranks, tables, strict=True):
            versions.setdefault(table.get(name, (None, None))[1], []).append(rank)
        if len(versions) == 1:
            continue
        parts = []
        for digest, holders in versions.items():
            if digest is None:
                parts.append(f"missing on ranks {holders}")
            else:
                meta = next(tables[ranks.index(r)][name][0] for r in holders)
                parts.append(f"ranks {holders}: {meta}, checksum {digest:#x}")
        problems.append(f"{name!r} differs ({'; '.join(parts)})")
    return (
        f"{model_name}: the ranks of the tensor-parallel group {ranks} were given different inputs: "
        + "; ".join(problems)
        + ". Every rank of a tensor-parallel group must get the same batch: seed the data loader's "
        "shuffling alike on every rank of the group (a DistributedSampler over the data-parallel ranks "
        "only), or load on one rank and broadcast. ShardConfig(check_inputs=False) turns this check off."
    )


def check_inputs(group, where: str, args: tuple, kwargs: dict) -> None:
    """Raise :class:`InputMismatch` on every rank of ``group`` if their tensor arguments differ
    (one all-gather of 16 bytes per rank; a second, of the per-input table, only on a mismatch)."""
    digests = input_digests(args, kwargs)
    mine = _combined(digests, group_device(group))  # on the device an NCCL-only group needs
    gathered = all_gather_cat(mine, group, dim=0, where=f"input check at the entry of {where}")
    if torch.equal(gathered, mine.expand_as(gathered)):
        return
    ranks = group_ranks(group)
    tables = all_gather_object(digests, group, where=f"input check at the entry of {where}: the per-input table")
    raise InputMismatch(_mismatch_message(where, tables, ranks))


class InputGate:
    """Which forwards check their inputs: every one with ``always``, else the first and each whose
    tensor inputs' names, shapes, dtypes and devices (host metadata: reading them costs no sync)
    differ from the last checked forward's. Ranks fed alike change shape together, so they agree
    on which forwards check."""

    def __init__(self, always: bool) -> None:
        self.always = always
        self.last: tuple | None = None

    @staticmethod
    def signature(args: tuple, kwargs: dict) -> tuple:
        named = [(f"arg{i}", a) for i, a in enumerate(args)] + sorted(kwargs.items())
        return tuple((n, tuple(t.shape), t.dtype, t.device) for n, t in named if isinstance(t, torch.Tensor))

    def check(self, group, where: str, args: tuple, kwargs: dict) -> None:
        """:func:`check_inputs` when due; a forward that passed sets the signature the next compare with."""
        if self.always:
            check_inputs(group, where, args, kwargs)
            return
        signature = self.signature(args, kwargs)
        if signature != self.last:
            self.last = None  # a failed check leaves the next forward due as well, on every rank
            check_inputs(group, where, args, kwargs)
            self.last = signature


def sync_random_state(group, device: torch.device) -> None:
    """Make this process's random state (CPU, and ``device``'s if CUDA) equal to the group's first rank's."""
    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    sizes = [s.numel() for s in states]
    buffer = torch.cat(states)
    buffer = broadcast(
        buffer.to(group_device(group)), group, where="generate() entry: random state from the first rank"
    )
    buffer = buffer.cpu()
    torch.set_rng_state(buffer[: sizes[0]].clone())
    if device.type == "cuda":
        torch.cuda.set_rng_state(buffer[sizes[0] :].clone(), device)


def _where_hook(label: str):
    def hook(module, args):
        if not compiling():  # a compiled graph's collectives are torch's, named by no scope (distributed.traced)
            current_scope().module = label

    return hook


def install_sequence_check(model: nn.Module, group, config) -> None:
    """The input check over the sequence-parallel ``group`` (every rank must see the same batch)."""
    if not config.check_inputs:
        return
    name = type(model).__name__
    gate = InputGate(config.check_inputs == "always")

    def same_inputs(module, args, kwargs):
        if not in_stage(module):  # inside a pipeline stage: pipeline_step checked it
            gate.check(group, f"{name}.forward (sequence-parallel group)", args, kwargs)

    attached(model).before_forward(
        model,
        "same_sequence_batch",
        same_inputs,
        with_kwargs=True,
        what="every sequence-parallel rank sees the same batch",
    )


def install(model: nn.Module, group, config) -> None:
    """Add the input check, the sampling sync and the collective naming to a sharded ``model``."""
    holders = set()
    for name, module in model.named_modules():
        if isinstance(module, ParallelModule):
            parts = name.split(".")
            holders.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    for name, module in model.named_modules():
        if name in holders:  # prepend: before any enter-TP-region hook on the same module reads the name
            module.register_forward_pre_hook(_where_hook(f"{name} ({type(module).__name__})"), prepend=True)
    model_name = type(model).__name__
    generating = [False]  # inside generate(): its inputs were checked once, at its entry
    if config.check_inputs:
        gate = InputGate(config.check_inputs == "always")

        def hook(module, args, kwargs):
            # inside generate(): checked at its entry; inside a pipeline stage: pipeline_step checked the batch
            if not generating[0] and not in_stage(module):
                gate.check(group, f"{model_name}.forward", args, kwargs)

        attached(model).before_forward(
            model, "same_inputs", hook, with_kwargs=True, what="every rank of the group sees the same batch"
        )
    if callable(getattr(model, "generate", None)):
        attached(model).route(
            model,
            "generate",
            "same_sampling",
            lambda generate: _synced_generate(model, generate, group, config, generating),
            what="the random state synced and the prompts checked across the group",
        )


def _synced_generate(model: nn.Module, generate, group, config, generating: list):
    model_name = type(model).__name__

    @functools.wraps(generate)
    def synced_generate(*args, **kwargs):
        param = next(model.parameters(), None)
        sync_random_state(group, param.device if param is not None else torch.device("cpu"))
        if config.check_inputs and not generating[0]:
            check_inputs(group, f"{model_name}.generate", args, kwargs)
        # the steps' inputs derive from the checked ones and the synced draws: not re-checked
        outer, generating[0] = generating[0], True
        try:
            return generate(*args, **kwargs)
        finally:
            generating[0] = outer

    return synced_generate


def freeze_for_inference(model: nn.Module, config: ShardConfig) -> None:
    """``inference_only``: eval mode, frozen parameters, and a clear error (first, before any
    collective) if the model is put back in training mode."""
    if not config.inference_only:
        return
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    name = type(model).__name__

    def refuse_training(module, args, kwargs):
        if module.training:
            raise RuntimeError(
                f"{name} was sharded with ShardConfig(inference_only=True): its backward all-reduce hooks and "
                "per-rank random streams were left out, so it cannot train; call model.eval(), or shard it "
                "without inference_only to train it"
            )

    attached(model).before_forward(
        model, "inference_only", refuse_training, with_kwargs=True, what="a training forward refused"
    )
