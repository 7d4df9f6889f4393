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


@attrs.frozen
class IdleRun:
    """How modules that run only on some input run without it (:class:`DataParallelSpec` ``idle_runs``):
    ``run(model)`` runs them on a stand-in input and returns a tensor of their result, just before
    the forward of the module at path ``at`` (from the policy's model), whose output then carries zero
    times that tensor."""

    at: str
    run: Callable


@attrs.frozen(kw_only=True)
class DataParallelSpec:
    """What data parallelism needs.

    * ``shard_dims``: ``{parameter name: dim}`` of parameters FSDP splits along a dimension other
      than 0 (a plan's ``dp`` entries say it);
    * ``idle_runs``: ``{input name: IdleRun(at, run)}`` for modules that run only when that input is
      given (a vision tower: ``pixel_values``). A data-parallel rank whose batch lacks the input (a
      text-only part beside parts with images) still runs them: ``run(model)`` on a stand-in input,
      just before module ``at`` (the first the model's forward calls after where they would have
      run), and zero times the result added to ``at``'s output. Its gradient there is zero, as the
      unsharded model's is, and every rank issues the same FSDP / DDP collectives in the same order.

    * ``static_graph``: every step uses the same parameters, some never (a vision tower's
      pooled-output norm Llava does not read): DDP is told (``static_graph=True``), so it reduces the
      used ones and does not wait for the others, where it would otherwise fail the second step.

    * ``find_unused``: a step may leave some parameters without a gradient, which ones not known
      beforehand (a model shardcore did not write: DeepSeek-V3.2's sparse-attention indexer, trained by
      a loss of its own, gets none from the model's): DDP finds them each step
      (``find_unused_parameters=True``). Without it, the bucket holding such a parameter is never
      reduced, and the gradients beside it stay each rank's own.

    * ``sharded_refusal``: why FSDP (``fsdp``, ``zero2``, ``hsdp``) cannot run the model, which DDP can: a
      step may leave parameters with a gradient on some ranks and none on others (LongCat-Flash's experts,
      beside zero-computation ones a rank's tokens may all choose), and FSDP reduce-scatters only the
      gradients there are, so the ranks' collectives would differ. ``optimize`` refuses those modes with it.

    Composite: the parts' ``shard_dims`` under their paths, the composite's own ``idle_runs`` (they
    name the model's inputs and its modules), ``static_graph`` and ``find_unused``; its own ``sharded_refusal``, or
    a part's under its path."""

    shard_dims: Mapping[str, int] = attrs.field(factory=dict, converter=dict)
    idle_runs: Mapping[str, IdleRun] = attrs.field(factory=dict, converter=dict)
    static_graph: bool = False
    find_unused: bool = False
    sharded_refusal: str | None = None

    @classmethod
    def merge(cls, own: DataParallelSpec | None, parts: Mapping[str, DataParallelSpec]) -> DataParallelSpec:
        own = own or cls()
        dims = dict(own.shard_dims)
        for path, p in parts.items():
            dims.update({under(path, n): d for n, d in p.shard_dims.items()})
        refusals = [own.sharded_refusal] + [
            f"{path}: {p.sharded_refusal}" for path, p in parts.items() if p.sharded_refusal
        ]
        return attrs.evolve(own, shard_dims=dims, sharded_refusal=next((r for r in refusals if r), None))
