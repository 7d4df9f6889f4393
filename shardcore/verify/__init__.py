"""Checks that a sharded model computes what the unsharded one did, for plans shardcore did not write.

A plan read from a model's config (zero-config), a YAML file or a dict can be wrong in ways no
structural check sees: a replicated parameter applied to split activations (its gradient is then
each rank's share only), a module whose forward reduces over a dimension the plan split (the
output is then another number). :func:`shardcore.optimize` runs two checks, on by default for such
plans and for every policy with ``ShardConfig(verify=True)``:

* **at optimize** (:class:`BlockProbe`): while the weights are whole, the model runs once on a small
  random input; the inputs of one block of each kind are kept, the block is run forward and
  backward on them, and the model's output is kept. After sharding the same block runs again on
  the same inputs, and the model too: the outputs, the input gradient and every parameter's
  gradient (gathered) are compared. A replicated parameter whose gradient is, summed over the
  group, the unsharded one gets that sum from now on (named in a warning); any other difference
  raises :class:`ShardingCheckError` naming the block and the parameters, before any training.
* **at the first backward** (:func:`check_first_backward`): a checksum of every replicated
  parameter's gradient is compared across the tensor-parallel group (one all-gather of two
  numbers per parameter); ranks that disagree raise :class:`ShardingCheckError` naming the
  parameters and the fix. Later steps are not touched: the hooks are removed after the first.

Both use shardcore's collectives over the tensor-parallel group, every rank alike.
"""

from __future__ import annotations

import logging

from .errors import ShardingCheckError
from .first_step import check_first_backward
from .probe import BlockProbe, probe_inputs, sum_found

__all__ = ["BlockProbe", "ShardingCheckError", "check_first_backward", "probe", "probe_inputs", "sum_found", "verify"]

log = logging.getLogger("shardcore")


def verifying(model, policy, config, tensor_parallel: bool) -> bool:
    """Whether the sharded model is checked against the unsharded one (``ShardConfig.verify``)."""
    if not tensor_parallel or config.verify is False:
        return False
    from ..plan import PlanPolicy

    return config.verify is True or isinstance(policy, PlanPolicy)


def _blocks(policy) -> list:
    """The blocks to check: a plan's in every container it touches, else the policy's."""
    planned = policy.checks().blocks
    return list(planned) if planned is not None else policy.blocks()


def probe(model, policy, config, tensor_parallel: bool) -> BlockProbe | None:
    """While the weights are whole: the unsharded blocks' outputs and gradients (no collective);
    ``None`` when not verifying, or for a model on the meta device (nothing to run)."""
    if not verifying(model, policy, config, tensor_parallel):
        return None
    if config.enable_sequence_parallelism:  # a block alone would get the whole sequence, not its slice
        log.warning(
            "shardcore: %s: the block check at optimize does not run with sequence parallelism; the first-step check does",
            type(model).__name__,
        )
        return None
    if any(p.device.type == "meta" for p in model.parameters()):
        log.warning(
            "shardcore: %s: the block check at optimize does not run on meta weights; the first-step check does",
            type(model).__name__,
        )
        return None
    found = BlockProbe(model, _blocks(policy), type(model).__name__, config.example_inputs)
    found.record()
    return found


def verify(model, policy, config, group, probed: BlockProbe | None, tensor_parallel: bool) -> None:
    """The sharded blocks and model against ``probed``; the first backward's gradient check armed
    (nothing when not verifying: :func:`probe` returned ``None`` and the policy is no plan's)."""
    if not verifying(model, policy, config, tensor_parallel):
        return
    name = type(model).__name__
    if probed is not None:
        found = probed.compare(group)
        if found:
            sum_found(model, _blocks(policy), found, group)
    if config.inference_only:
        return
    if config.data_parallel is not None:
        log.warning(
            "shardcore: %s: the first-step gradient check does not run with data_parallel=%r "
            "(the data-parallel reduction races it); the block check at optimize did",
            name,
            config.data_parallel,
        )
        return
    check_first_backward(model, group, name)
