"""The Policy contract: a few members, one declared spec per parallelism, one merge rule for composites,
and 0.x's spelling still read (warned) for a minor version."""

from __future__ import annotations

import ast
import inspect
import pathlib
import warnings

import pytest
import torch
from toy_models import ToyLM, ToyPair, ToyPolicy

import shardcore
from shardcore import CompositePolicy, Policy
from shardcore.checkpoint.parts import StackedParts
from shardcore.spec import (
    SPECS,
    CheckpointSpec,
    ChecksSpec,
    DataParallelSpec,
    ExpertSpec,
    KernelSpec,
    PipelineSpec,
    SequenceSpec,
    TensorParallelSpec,
)

CORE = pathlib.Path(shardcore.__file__).parent


def test_the_policy_a_plugin_subclasses_has_at_most_20_public_members():
    public = [n for n, _ in inspect.getmembers(Policy) if not n.startswith("_")]
    assert len(public) <= 20, public
    for method in SPECS:  # every spec is one method of the policy
        assert method in public, method


def _pipeline(tag: str) -> PipelineSpec:
    return PipelineSpec(
        ends={tag: "first"},
        inputs=lambda b, t=True: ((), None),
        stage_forward=lambda *a, **k: None,
        output=lambda o, loss, *e: o,
        num_items=lambda labels: 1,
        loss=lambda o, labels, n: o,
    )


class _Part(ToyPolicy):
    """A part's policy declaring every spec (what it declares names its part-relative names)."""

    calls: list = []

    def tensor_parallel(self):
        return TensorParallelSpec(parallel_output=True, share_copies=True, grad_sum=["norm.weight"])

    def pipeline(self):
        return _pipeline("embed")

    def sequence(self):
        return SequenceSpec(modes=("split_gather",), heads=(4, 4))

    def experts(self):
        return ExpertSpec(supported=True, balance=lambda gather: self.calls.append(gather))

    def data_parallel(self):
        return DataParallelSpec(shard_dims={"head.weight": 1})

    def kernels(self):
        return KernelSpec(norm_classes=(torch.nn.LayerNorm,), fusible=[("blocks.0", self.model.blocks[0])])

    def checkpoints(self):
        def names(names):
            assert all(not n.startswith(("tower.", "lm.")) for n in names), (
                f"a part asked in the whole model's names: {names[:2]}"
            )
            return {n: n.replace("embed", "wte") for n in names if n.startswith("embed")}

        def parts(names):
            return {n: StackedParts(((f"{n}.0",), (f"{n}.1",))) for n in names if n == "norm.weight"}

        return CheckpointSpec(names=names, parts=parts)

    def checks(self):
        return ChecksSpec(blocks=[("blocks.1", self.model.blocks[1])])


class _Plain(ToyPolicy):
    """A part's policy declaring nothing but tensor parallelism."""


class _Pair(CompositePolicy):
    own: dict = {}

    def parts(self):
        return ["tower", "lm"]

    def part_policy(self, path):
        return _Part if path == "tower" else _Plain

    def glue_specs(self):
        return self.own


def _composite(own: dict | None = None) -> _Pair:
    policy = _Pair()
    policy.own = own or {}
    policy.set_model(ToyPair())
    return policy


def test_a_composite_merges_tensor_parallel_from_its_parts():
    spec = _composite().tensor_parallel()
    assert spec.grad_sum == ("tower.norm.weight",), (
        f"gradient sums {spec.grad_sum}, not the tower's norm under its path"
    )
    assert spec.share_copies
    assert not spec.parallel_output, "the output is the composite's forward's: its own declaration only"
    assert _composite({"tensor_parallel": TensorParallelSpec(parallel_output=True)}).tensor_parallel().parallel_output


def test_a_composite_pipeline_is_its_own_only():
    assert _composite().pipeline() is None, "the parts' pipelines cannot be joined: refused unless declared"
    own = _pipeline("tower.embed")
    assert _composite({"pipeline": own}).pipeline() is own


def test_a_composite_sequence_is_its_own_only():
    assert _composite().sequence().modes == (), "the composite took a part's sequence modes as its own"
    own = SequenceSpec(modes=("all_to_all",), heads=(8, 8))
    assert _composite({"sequence": own}).sequence() == own


def test_a_composite_merges_experts_from_its_parts():
    policy = _composite()
    _Part.calls.clear()
    spec = policy.experts()
    assert spec.supported and spec.refusal is None
    spec.balance("gather")
    assert _Part.calls == ["gather"]
    refused = _composite({"experts": ExpertSpec(refusal="its router is its own")}).experts()
    assert not refused.supported and refused.refusal == "its router is its own"


def test_a_composite_merges_data_parallel_from_its_parts():
    assert _composite().data_parallel().shard_dims == {"tower.head.weight": 1}


def test_a_composite_merges_kernels_from_its_parts():
    policy = _composite()
    spec = policy.kernels()
    assert spec.norm_classes == (torch.nn.LayerNorm,)
    names = [n for n, _ in spec.fusible]
    assert names == ["tower.blocks.0"], f"fused modules {names}, not named from the whole model"
    assert spec.fusible[0][1] is policy.model.tower.blocks[0]
    assert spec.attention_backend is None


def test_a_composite_merges_checkpoints_from_its_parts():
    spec = _composite().checkpoints()
    names = [n for n, _ in ToyPair().named_parameters()]
    renamed = spec.names(names)
    assert renamed == {"tower.embed.weight": "tower.wte.weight"}, renamed
    parts = spec.parts(names)
    assert list(parts) == ["tower.norm.weight"]
    assert parts["tower.norm.weight"].keys == (("tower.norm.weight.0",), ("tower.norm.weight.1",))
    assert spec.materialize is None
    assert _composite({"checkpoints": CheckpointSpec()}).checkpoints().names(["lm.embed.weight"]) == {}


def test_a_composite_merges_checks_from_its_parts():
    policy = _composite()
    blocks = [n for n, _ in policy.checks().blocks]
    # the tower names its blocks to check; the lm names none: its blocks(); the glue has none
    assert blocks == ["tower.blocks.1", "lm.blocks.0", "lm.blocks.1"], blocks


def test_every_spec_has_a_composite_test():
    tested = {n.removeprefix("test_a_composite_merges_").split("_from")[0] for n in globals() if "composite" in n}
    tested |= {n.removeprefix("test_a_composite_").split("_is")[0] for n in globals() if "composite" in n}
    assert set(SPECS) <= tested, set(SPECS) - tested


def _declared() -> set[str]:
    members = {n for n, _ in inspect.getmembers(Policy)}
    return members | set(Policy.__annotations__)


def test_the_core_reads_no_policy_member_the_base_does_not_declare():
    """``getattr(policy, "x")`` / ``hasattr(policy, "x")`` of a name the base does not declare was how 0.x
    grew members no one could see; only the 0.x reader (spec/legacy.py) may read them."""
    found = []
    for path in CORE.rglob("*.py"):
        if path.name == "legacy.py":
            continue
        self_is_a_policy = path.name in ("policy.py", "composite.py")  # shardcore/policy.py, composite, plan/policy.py
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2):
                continue
            if node.func.id not in ("getattr", "hasattr"):
                continue
            target, name = ast.unparse(node.args[0]), node.args[1]
            if not (target == "policy" or target.endswith(".policy") or (self_is_a_policy and target == "self")):
                continue
            if isinstance(name, ast.Constant) and not name.value.startswith("_") and name.value not in _declared():
                found.append(f"{path.relative_to(CORE)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)


# -- 0.x's spelling -------------------------------------------------------------------------------


def _old_policy():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        class OldPolicy(ToyPolicy):
            sequence_parallelism_modes = ("split_gather",)
            supports_parallel_output = True

            def sequence_parallel_heads(self):
                return 4, 4

            def fusible_modules(self):
                return [("blocks.0", self.model.blocks[0])]

            @property
            def grad_sum_parameters(self):
                return ["norm.weight"]

    return OldPolicy, [str(w.message) for w in caught if w.category is DeprecationWarning]


def test_a_policy_written_on_0x_members_warns_once_naming_the_new_spelling():
    _, warned = _old_policy()
    assert len(warned) == 1, f"{len(warned)} DeprecationWarnings for a 0.x policy class, not one: {warned}"
    for old, new in [
        ("sequence_parallelism_modes", "sequence().modes"),
        ("supports_parallel_output", "tensor_parallel().parallel_output"),
        ("fusible_modules", "kernels().fusible"),
        ("grad_sum_parameters", "tensor_parallel().grad_sum"),
    ]:
        assert f"{old} -> {new}" in warned[0], warned[0]


def test_a_policy_written_on_0x_members_keeps_working():
    cls, _ = _old_policy()
    policy = cls()
    policy.set_model(ToyLM())
    assert policy.sequence().modes == ("split_gather",) and policy.sequence().heads == (4, 4)
    assert policy.tensor_parallel() == TensorParallelSpec(parallel_output=True, grad_sum=["norm.weight"])
    assert [n for n, _ in policy.kernels().fusible] == ["blocks.0"]
    assert policy.pipeline() is None  # it declared no pipeline hooks: refused, as 0.x refused it


def test_0x_helpers_and_members_read_from_a_new_policy_warn():
    policy = ToyPolicy()
    policy.set_model(ToyLM())
    with pytest.warns(DeprecationWarning, match=r"Policy\.blocks_in is 0\.x's spelling: use shardcore\.plugin_api"):
        assert [n for n, _ in policy.blocks_in(policy.model.blocks)] == ["blocks.0", "blocks.1"]
    with pytest.warns(DeprecationWarning, match=r"use Policy\.sequence\(\)\.modes"):
        assert policy.sequence_parallelism_modes == ()
    with pytest.warns(DeprecationWarning, match=r"use Policy\.kernels\(\)\.norm_classes"):
        assert policy.norm_classes() == ()
    with pytest.raises(AttributeError, match="no attribute 'no_such_member'"):
        policy.no_such_member  # noqa: B018 - the attribute read is the test


def test_the_old_hook_bases_warn_from_the_plugin_api():
    import shardcore.plugin_api as api

    with pytest.warns(
        DeprecationWarning, match=r"PipelineHooks is 0\.x's spelling: return a shardcore\.plugin_api\.PipelineSpec"
    ):
        assert api.PipelineHooks.__name__ == "PipelineHooks"


def test_an_old_pipeline_hooks_policy_builds_its_spec():
    """A 0.x policy that wrote every pipeline hook gets a PipelineSpec from them (bound to the policy)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)

        class OldStages(ToyPolicy):
            def pipeline_ends(self):
                return {"embed": "first", "norm": "last", "head": "last"}

            def pipeline_inputs(self, batch, training=True):
                return (batch["ids"],), batch.get("labels")

            def pipeline_stage_forward(self, inputs, *, first, last):
                return inputs

            def pipeline_output(self, output, loss):
                return output

            def pipeline_num_items(self, labels):
                return labels.numel()

            def pipeline_loss(self, output, labels, num_items):
                return output.sum() / num_items

    policy = OldStages()
    policy.set_model(ToyLM())
    spec = policy.pipeline()
    assert spec.ends == {"embed": "first", "norm": "last", "head": "last"}
    assert spec.inputs({"ids": 1, "labels": 2}) == ((1,), 2)
    assert spec.num_items(torch.ones(3)) == 3


def test_a_sequence_spec_is_read_with_its_defaults():
    """What the sequence steps read: the declared regions, heads and attention, else the defaults (one
    region of every block; HuggingFace's registry, which shardcore registers on import)."""
    from shardcore.sequence.declared import attention_problem, heads_of, regions, set_attention
    from shardcore.spec.attention import attention_registry

    assert attention_registry().module.__name__ == "shardcore.integrations.hf.attention", (
        "HuggingFace's registry registered"
    )
    policy = ToyPolicy()
    policy.set_model(ToyLM())
    assert regions(policy) == [policy.blocks()]
    with pytest.raises(NotImplementedError, match=r"declares no SequenceSpec\.heads"):
        heads_of(policy)
    assert "ToyLM" in attention_problem(policy, "all_to_all")  # not a transformers model: the registry says so

    class Declared(ToyPolicy):
        def sequence(self):
            return SequenceSpec(
                heads=(4, 2),
                regions=[self.blocks()[:1]],
                attention_problem=lambda mode: f"not {mode}",
                set_attention=lambda state: f"ours under {state}",
            )

    policy = Declared()
    policy.set_model(ToyLM())
    found = [[n for n, _ in r] for r in regions(policy)]
    assert found == [["blocks.0"]], f"split_gather regions {found}, not the declared [['blocks.0']]"
    assert heads_of(policy) == (4, 2)
    assert attention_problem(policy, "ring_attn") == "not ring_attn"
    assert set_attention(policy, "ring") == "ours under ring"


def test_a_0x_policy_on_the_old_hook_bases_still_loads_and_declares_nothing_it_did_not():
    """0.1's hook bases still come from shardcore.plugin_api (warned): a policy built on them loads, and the
    defaults they carry declare nothing (no pipeline; the sequence modes it names are read)."""
    import shardcore.plugin_api as api

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        hooks = (api.PipelineHooks, api.SequenceHooks)

        class OldHooks(*hooks, ToyPolicy):
            sequence_parallelism_modes = ("split_gather",)

    policy = OldHooks()
    assert policy.pipeline() is None
    assert policy.sequence().modes == ("split_gather",)
