"""What a policy says about expert parallelism (:class:`ExpertParallelHooks`, a base of :class:`~shardcore.Policy`)."""

from __future__ import annotations

from collections.abc import Callable

import torch


class ExpertParallelHooks:
    """The expert-parallel part of the policy contract (see :mod:`shardcore.expert_parallel`)."""

    #: Whether the policy splits its experts over ``ShardConfig(expert_parallel_size=...)`` ranks
    #: (its experts modules then carry ``expert_parallel = True``). ``optimize`` refuses the size otherwise.
    supports_expert_parallel: bool = False
    #: Why the policy refuses ``expert_parallel_size`` (``None``: it has no experts to split or route).
    expert_parallel_refusal: str | None = None

    def balance_over_global_batch(self, gather: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Make the model's router load-balancing loss count the routing of the whole global batch
        (``ShardConfig(global_batch_balance=True)``): ``gather(t)`` concatenates ``t`` over the
        data-parallel ranks along dimension 0 (differentiable: the gradient of every rank's copy of
        the loss reaches the rank whose tokens it came from). Called once by ``optimize``."""
        raise NotImplementedError(
            f"{type(self).__name__} has no router load-balancing loss to compute over the global batch; "
            "leave ShardConfig(global_batch_balance=False)"
        )
