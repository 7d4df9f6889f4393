"""What the wrapper tells the audits of :mod:`shardcore.testing.syncs`, so that they need patch nothing.

* :func:`host_sync`: a wait that blocks the host (a ``wait(timeout)`` on gloo, an object collective,
  a barrier) is told to every listener in :data:`LISTENERS` (the sync audit records its caller);
* :func:`check_device`: while a device-strict audit runs (:data:`STRICT` holds the model's device),
  a tensor handed to a collective anywhere else is refused, naming the collective: on a GPU it
  would be a CPU tensor on an NCCL group.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: called with the kind of each host-blocking wait (``"wait(timeout)"``, ``"barrier"``, ...)
LISTENERS: list[Callable[[str], None]] = []
#: while a device-strict audit runs: the one device its collectives' tensors may be on
STRICT: list[torch.device] = []


class DeviceAuditError(RuntimeError):
    """A collective got a tensor on another device than the model's (a device-strict audit)."""


def host_sync(kind: str) -> None:
    for listener in list(LISTENERS):
        listener(kind)


def check_device(kind: str, where, tensor: torch.Tensor) -> None:
    if STRICT and tensor.device != STRICT[-1]:
        raise DeviceAuditError(
            f"shardcore: {kind} ({where or 'outside any parallel module'}) got a tensor on {tensor.device}, "
            f"not on the model's device {STRICT[-1]}: on a GPU this is a CPU tensor on an NCCL group. "
            "Allocate it on distributed.collectives.group_device(group) or on the model's device"
        )
