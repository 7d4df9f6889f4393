"""Plugins written against 0.1's import paths keep working, warned: ``shardcore.layers`` (now
``shardcore.tensor_parallel``) and its modules, one ``DeprecationWarning`` naming the new import."""

from __future__ import annotations

import subprocess
import sys

import pytest
from toy_models import ToyBlock, ToyLM, toy_batch

from shardcore import ModulePolicyDescription, Policy, ShardConfig, SubModuleReplacementDescription
from shardcore.testing import assert_sharded_matches, run_on_ranks


def test_the_old_package_warns_naming_the_new_import_and_every_old_module_is_the_new_code():
    """One fresh interpreter (the warning fires at the first import only): the warning, then the names."""
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always', DeprecationWarning)\n"
        "    from shardcore.layers import Linear1D_Col, VocabParallelEmbedding1D\n"
        "    from shardcore.layers.comm import copy_to_tp, enter_tp_region\n"
        "    from shardcore.layers.linear import Linear1D_Row\n"
        "    from shardcore.layers.shard_spec import ShardSpec\n"
        "print([str(w.message) for w in caught if w.category is DeprecationWarning])\n"
        "import shardcore.tensor_parallel as tp\n"
        "from shardcore.tensor_parallel import mappings, regions\n"
        "assert (Linear1D_Col, Linear1D_Row, VocabParallelEmbedding1D, ShardSpec) == "
        "(tp.Linear1D_Col, tp.Linear1D_Row, tp.VocabParallelEmbedding1D, tp.ShardSpec)\n"
        "assert copy_to_tp is mappings.copy_to_tp and enter_tp_region is regions.enter_tp_region\n"
        "print('same')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    warned, same = out.strip().splitlines()
    assert "import from shardcore.tensor_parallel instead" in warned and "goes away in 0.3" in warned, (
        f"importing shardcore.layers gave the DeprecationWarnings {warned}"
    )
    assert same == "same"


class OldPathsPolicy(Policy):
    """A 0.1 plugin's policy, word for word its imports: ``shardcore.layers``."""

    def blocks(self):
        return self.blocks_in(self.model.blocks)

    def module_policy(self):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the first test checks the warning
            from shardcore.layers import FusedLinear1D_Col, Linear1D_Col, Linear1D_Row

        block = self.model.blocks[0]
        sub = SubModuleReplacementDescription
        qkv = {"heads": (block.num_heads,) * 3, "head_dim": block.head_dim}
        return {
            ToyBlock: ModulePolicyDescription(
                attribute_replacement={"num_heads": block.num_heads // self.tp_size},
                sub_module_replacement=[
                    sub(suffix="qkv", target_module=FusedLinear1D_Col, kwargs=qkv),
                    sub(suffix="proj", target_module=Linear1D_Row),
                    sub(suffix="fc1", target_module=Linear1D_Col),
                    sub(suffix="fc2", target_module=Linear1D_Row),
                ],
            )
        }


def _check(tp: int) -> dict:
    return assert_sharded_matches(ToyLM, toy_batch(), ShardConfig(tensor_parallel_size=tp), policy=OldPathsPolicy)


def test_a_policy_on_the_old_paths_passes_the_kit():
    for report in run_on_ranks(2, _check, 2):
        assert "max_abs_diff_after_steps" in report, report


def _old_names(old: str, new: str, names: tuple[str, ...]) -> tuple[str, bool]:
    """The DeprecationWarnings reading ``names`` from module ``old`` gives (each read warns: a module
    ``__getattr__``), and whether each is module ``new``'s own object."""
    import importlib
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        got = [getattr(importlib.import_module(old), n) for n in names]
    warned = str([str(w.message) for w in caught if w.category is DeprecationWarning])
    return warned, all(a is getattr(importlib.import_module(new), n) for a, n in zip(got, names, strict=True))


def test_the_attention_registry_s_old_names_in_kernels_warn_and_are_the_new_code():
    """0.1's ``shardcore.kernels.use_hf_attention`` & co. moved to ``shardcore.integrations.hf.attention``
    (the core knows no model library); the old names still work, each with a DeprecationWarning."""
    names = ("use_hf_attention", "ulysses_problem", "HF_SDPA", "hf_sdpa_name")
    warned, same = _old_names("shardcore.kernels", "shardcore.integrations.hf.attention", names)
    assert warned.count("moved to shardcore.integrations.hf.attention") == 4, (
        f"the moved attention names did not each warn naming their new module: {warned}"
    )
    assert same, "an old name in shardcore.kernels is not the moved function itself"


def test_the_causal_lm_loss_glue_s_old_names_in_losses_warn_and_are_the_new_code():
    """``shardcore.losses.defer_logits_gather`` / ``loss_on_head_slices`` (transformers' ``loss_function``
    glue) moved to ``shardcore.integrations.hf.causal_lm_loss``; the old names work, warned."""
    names = ("defer_logits_gather", "loss_on_head_slices")
    warned, same = _old_names("shardcore.losses", "shardcore.integrations.hf.causal_lm_loss", names)
    assert warned.count("moved to shardcore.integrations.hf.causal_lm_loss") == 2, (
        f"the moved loss glue did not warn naming its new module: {warned}"
    )
    assert same, "an old name in shardcore.losses is not the moved function itself"


def test_the_core_steps_old_name_warns_and_is_the_new_function():
    import shardcore.steps

    with pytest.warns(DeprecationWarning, match=r"shardcore\.steps\.optimize is shardcore\.steps\.shard now"):
        old = shardcore.steps.optimize
    assert old is shardcore.steps.shard
    with pytest.raises(AttributeError, match="has no attribute 'optimise'"):
        shardcore.steps.optimise  # noqa: B018


def test_0_1_stage_attributes_warn_naming_the_value_and_are_read_into_it():
    """An HFStages policy written against 0.1 (class attributes, a property among them) warns once, at its
    class, naming the StageFacts fields; its stages() is the value those attributes say."""
    import warnings

    from shardcore.plugin_api import HFStages, StageFacts

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)

        class OldPolicy(HFStages, Policy):
            first_ends = ("embed_tokens",)
            last_ends = ("norm",)
            stage_inputs = {"attention_mask": "ones"}
            stage_block_returns_tuple = True

            @property
            def stage_loss(self):
                return "masked_lm"

            def module_policy(self):
                return {}

    messages = [str(w.message) for w in caught if w.category is DeprecationWarning]
    assert len(messages) == 1 and "StageFacts(first_ends=..., last_ends=..., inputs=..., loss=..." in messages[0], (
        messages
    )
    assert "(the old spelling goes away in 0.3)" in messages[0], messages
    want = StageFacts(
        first_ends=("embed_tokens",),
        last_ends=("norm",),
        inputs={"attention_mask": "ones"},
        block_returns_tuple=True,
        loss="masked_lm",
    )
    assert OldPolicy().stages() == want


def test_stage_facts_refuse_what_they_cannot_mean():
    from shardcore.plugin_api import StageFacts

    with pytest.raises(ValueError, match=r"StageFacts\(loss='lm'\): choose one of"):
        StageFacts(loss="lm")
    with pytest.raises(ValueError, match=r"the defaults \{'position_ids': 'range'\} are not among"):
        StageFacts(inputs={"position_ids": "range"})
    with pytest.raises(ValueError, match=r"StageFacts\(first_ends='embed'\): give a tuple of names"):
        StageFacts(first_ends="embed")
    caller = {"attention_mask": "ones"}
    facts = StageFacts(inputs=caller)
    caller["position_ids"] = "arange"
    assert facts.inputs == {"attention_mask": "ones"}  # its own copy
