"""A composite model's parts sharded by the policies the registry finds for them (CompositePolicy)."""

from __future__ import annotations

import pytest
from toy_models import ToyBlock, ToyLM, ToyPair, ToyPolicy, toy_batch

from shardcore import (
    CompositePolicy,
    ModulePolicyDescription,
    ShardConfig,
    SubModuleReplacementDescription,
    hookimpl,
)
from shardcore.testing import assert_sharded_matches, refusal_message, run_on_ranks


# --8<-- [start:composite]
class PairPolicy(CompositePolicy):
    """The two parts by their own policy (found in the registry), the ``mix`` glue column parallel (the
    vocabulary, 128, must divide: the glue's own check is this policy's to write)."""

    def parts(self):
        return ["tower", "lm"]

    def glue_policy(self):
        from shardcore.builders import mlp
        from shardcore.tensor_parallel import Linear1D_Col

        mix = SubModuleReplacementDescription(suffix="mix", target_module=Linear1D_Col, kwargs={"gather_output": True})
        return {
            ToyPair: ModulePolicyDescription(sub_module_replacement=[mix]),
            # the glue's own ToyBlock: its MLP split, its attention whole (the parts' blocks are the parts')
            ToyBlock: ModulePolicyDescription(sub_module_replacement=mlp("")),
        }


# --8<-- [end:composite]


class _ToyPlugin:
    """Covers ToyLM for the duration of a call (a plugin registered in process, as a test registers one)."""

    @hookimpl
    def shardcore_register_policies(self, register):
        from shardcore.plugins import qualname

        register(qualname(ToyLM), ToyPolicy)


def _with_toy_plugin(fn, *args, **kwargs):
    from shardcore.plugins import get_registry

    registry = get_registry()
    registry.register(_ToyPlugin(), name="toy")
    try:
        return fn(*args, **kwargs)
    finally:
        registry.unregister("toy")


def _check(tp: int) -> dict:
    def run():
        report = assert_sharded_matches(
            lambda: ToyPair(vocab=128), toy_batch(128), ShardConfig(tensor_parallel_size=tp), policy=PairPolicy
        )
        import shardcore
        from shardcore.tensor_parallel import FusedLinear1D_Col, Linear1D_Col

        model = shardcore.optimize(ToyPair(vocab=128), ShardConfig(tensor_parallel_size=tp), policy=PairPolicy)
        names = [name for name, _ in model.shardcore.policy.blocks()]
        assert names == ["tower.blocks.0", "tower.blocks.1", "lm.blocks.0", "lm.blocks.1"], names
        assert isinstance(model.tower.blocks[0].qkv, FusedLinear1D_Col)  # the parts: by the part's policy
        assert isinstance(model.mix, Linear1D_Col)  # the glue: by the composite's own description
        # the glue's ToyBlock as the glue says (MLP split, attention whole), not as the parts' policy would
        assert isinstance(model.adapter.fc1, Linear1D_Col) and type(model.adapter.qkv).__name__ == "Linear"
        return report

    return _with_toy_plugin(run)


@pytest.mark.parametrize("tp", [2, 4])
def test_each_part_is_sharded_by_the_policy_the_registry_finds(tp):
    for report in run_on_ranks(tp, _check, tp):
        assert "max_abs_diff_after_steps" in report, report


def _refused(tp: int) -> str:
    return _with_toy_plugin(
        refusal_message, lambda: ToyPair(heads=3), ShardConfig(tensor_parallel_size=tp), policy=PairPolicy
    )


def test_a_part_s_refusal_names_the_part_on_every_rank():
    for message in run_on_ranks(2, _refused, 2):
        assert "ToyPair.tower (ToyPolicy): ToyLM: num_heads=3 is not divisible" in message, message


def test_parts_must_not_nest():
    policy = PairPolicy()
    policy.parts = lambda: ["lm", "lm.blocks"]
    policy.set_model(ToyPair())
    with pytest.raises(ValueError, match=r"'lm\.blocks' lies inside 'lm'; parts must not nest"):
        policy.part_policies()
