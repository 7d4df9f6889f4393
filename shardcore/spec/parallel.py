"""What tensor, expert and data parallelism read from a family, besides its module descriptions."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from .under import under

__all__ = ["DataParallelSpec", "ExpertSpec", "TensorParallelSpec"]


@attrs.frozen(kw_only=True)
class TensorParallelSpec:
    """What tensor parallelism needs beyond the module descriptions.

    * ``parallel_output``: the policy honours ``ShardConfig(parallel_output=True)`` (logits kept split over
      the vocabulary, the loss computed from the slices); ``optimize`` refuses the flag otherwise.
    * ``share_copies``: during each forward, column-parallel layers reading the same tensor share one
      backward all-reduce without ``enter_tp_region`` entries (plans use it; plugins name their regions).
    * ``grad_sum``: names of replicated parameters each rank applies to its own slice only (a per-head norm,
      a relative-position table): their gradient is each rank's share, summed over the group by the sharder.

    Composite: ``parallel_output`` is the composite's own (its forward makes the output); the rest the union
    of the parts', under their paths, and its own.
    """

    parallel_output: bool = False
    share_copies: bool = False
    grad_sum: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    @classmethod
    def merge(cls, own: TensorParallelSpec | None, parts: Mapping[str, TensorParallelSpec]) -> TensorParallelSpec:
        own = own or cls()
        return cls(
            parallel_output=own.parallel_output,
            share_copies=own.share_copies or any(p.share_copies for p in parts.values()),
            grad_sum=(*own.grad_sum, *(under(path, n) for path, p in parts.items() for n in p.grad_sum)),
        )


@attrs.frozen(kw_only=True)
class ExpertSpec:
    """What expert parallelism needs (see :mod:`shardcore.expert_parallel`).

    * ``supported``: the policy splits its experts over ``expert_parallel_size`` ranks (its experts modules
      carry ``expert_parallel = True``); ``optimize`` refuses the size otherwise.
    * ``refusal``: why it refuses (``None``: it has no experts to split or route).
    * ``balance``: ``balance(gather)`` makes the router's load-balancing loss count the routing of the whole
      global batch (``global_batch_balance=True``); ``gather(t)`` concatenates ``t`` over the data-parallel
      ranks along dim 0, differentiably. ``None``: the model has no such loss.

    Composite: supported when a part (or the composite) is and nothing refuses; every part's ``balance``.
    """

    supported: bool = False
    refusal: str | None = None
    balance: Callable[[Callable], None] | None = None

    @classmethod
    def merge(cls, own: ExpertSpec | None, parts: Mapping[str, ExpertSpec]) -> ExpertSpec:
        own = own or cls()
        specs = [own, *parts.values()]
        refusal = next(
            (f"{path}: {p.refusal}" if path else p.refusal for path, p in [("", own), *parts.items()] if p.refusal),
            None,
        )
        balances = [p.balance for p in specs if p.balance is not None]

        def balance(gather: Callable) -> None:
            for one in balances:
                one(gather)

        return cls(
            supported=refusal is None and any(p.supported for p in specs),
            refusal=refusal,
            balance=balance if balances else None,
        )


@attrs.frozen(kw_only=True)
class DataParallelSpec:
    """What data parallelism needs: ``shard_dims``, ``{parameter name: dim}`` of parameters FSDP splits
    along a dimension other than 0 (a plan's ``dp`` entries say it). Composite: the parts' under their paths."""

    shard_dims: Mapping[str, int] = attrs.field(factory=dict, converter=dict)

    @classmethod
    def merge(cls, own: DataParallelSpec | None, parts: Mapping[str, DataParallelSpec]) -> DataParallelSpec:
        own = own or cls()
        dims = dict(own.shard_dims)
        for path, p in parts.items():
            dims.update({under(path, n): d for n, d in p.shard_dims.items()})
        return cls(shard_dims=dims)
