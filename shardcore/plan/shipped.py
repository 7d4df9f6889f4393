"""What a model no plugin covers ships besides its TP plan: pipeline stages from its pipeline plan,
expert parallelism from its expert plan.

transformers gives 130 config classes a ``base_model_pp_plan``: the base model's modules in their
order, each with the inputs it takes and the outputs it hands on (``embed_tokens``: ``input_ids`` ->
``inputs_embeds``; ``layers``: ``hidden_states``, ``attention_mask`` -> ``hidden_states``; ``norm``),
and the model class a ``_pp_plan`` for its head (``lm_head``: ``hidden_states`` -> ``logits``). That
is all :class:`~shardcore.integrations.hf.stages.HFStages` needs: the modules before the repeated
blocks run on the first stage only, those after on the last, and every stage runs the model's own
forward over its blocks (the others' are holes keeping their attributes, so a sliding layer stays
sliding), rebuilding the masks and the rotary embeddings from the inputs that travel with the hidden
states. :class:`ShippedPlanPolicy` is the zero-config policy with those stages; a model whose plan
the stages cannot follow is refused by name when a pipeline is asked for, never run wrong.

Its sequence parallelism (Ulysses, the ring) runs the model's attention through transformers'
registry, as the plugins' does (a model built with ``eager`` attention: its own modeling module's
eager function); under Ulysses per-head attention sinks are cut to each rank's heads. Megatron's
``split_gather`` follows the region the TP plan gives (:mod:`shardcore.plan.region`). Under
expert parallelism the experts modules the config's ``base_model_ep_plan`` dispatches tokens to
(``ep_dispatch_experts``) hold whole experts over the ``ep x tp`` ranks (the core's ``ExpertsEP``)."""

from __future__ import annotations

import attrs
from torch import nn

from ..integrations.hf.attention import bias_passers, mask_readers, tensor_inputs
from ..integrations.hf.heads import sequence_heads
from ..integrations.hf.masks import mask_builders
from ..integrations.hf.stages import HFStages, StageFacts
from ..kernels import attention_registry
from ..policy import ModulePolicyDescription
from ..policy import SubModuleReplacementDescription as Sub
from ..spec import ExpertSpec, SequenceSpec
from .mixers import token_mixers
from .policy import PlanPolicy
from .region import region_entries, region_problem
from .syntax import _regex

__all__ = ["ShippedPlanPolicy", "shipped_stage_facts"]

#: what the blocks may take: the hidden states, and what the model's own forward builds on every stage
_BUILT = ("hidden_states", "attention_mask")


def _refuse(model: nn.Module, what: str) -> NotImplementedError:
    config = type(getattr(model, "config", None)).__name__
    return NotImplementedError(f"{config}'s base_model_pp_plan: {what}; write a plugin with its stages")


def shipped_stage_facts(model: nn.Module, base: nn.Module, blocks: list[tuple[str, nn.Module]]) -> StageFacts:
    """The :class:`StageFacts` of ``model`` from the pipeline plans it ships, checked against its
    modules (``blocks``: its repeated blocks, as the policy found them); NotImplementedError naming
    what the stages cannot follow."""
    plan = getattr(getattr(base, "config", None), "base_model_pp_plan", None)
    if not plan:
        raise _refuse(model, "none ships (transformers gives this config class no pipeline plan)")
    heads = dict(getattr(type(model), "_pp_plan", None) or {})
    if not type(model).__name__.endswith("ForCausalLM") or list(heads) != ["lm_head"]:
        raise _refuse(model, f"stages are built for a *ForCausalLM with an lm_head, not {type(model).__name__}")
    names = list(plan)
    container = [n for n in names if isinstance(getattr(base, n, None), nn.ModuleList)]
    prefix = next((n for n, m in model.named_modules() if m is base), "")
    held = {f"{prefix}.{n}" if prefix else n for n in container}
    if len(container) != 1 or not blocks or {name.rpartition(".")[0] for name, _ in blocks} != held:
        raise _refuse(model, f"its modules {names} name no one list of the model's blocks ({container})")
    taken = [i for i in plan[container[0]][0] if i not in _BUILT]
    if taken:
        raise _refuse(model, f"its blocks take {taken}, which no stage builds (they take {list(_BUILT)})")
    handed = _handed_on(type(base), container[0])
    if handed:
        raise _refuse(
            model, f"its blocks hand {handed} on to the next block besides the hidden states; no stage carries it"
        )
    unplaced = [n for n, m in base.named_children() if n not in plan and any(True for _ in m.parameters())]
    if unplaced:
        raise _refuse(model, f"{unplaced} hold parameters and are on no stage of it (it places {names})")
    at = names.index(container[0])
    return StageFacts(first_ends=tuple(names[:at]), last_ends=tuple(names[at + 1 :]), heads=("lm_head",))


#: what a block may take besides the hidden states and the keywords split with them: built before the blocks
#: for the whole sequence and read whole (the mask, the positions the attention function takes), no tensor, or
#: the key/value states an earlier layer's attention computed over this rank's part (Gemma 4's shared_kv_states);
#: and any mask (Falcon-H1's mamba_attention_mask: the padding of the whole sequence, what a gathered mixer reads)
_BLOCK_KNOWS = {"self", "hidden_states", "attention_mask", "position_ids", "position_embeddings", "kwargs", "args"}
_BLOCK_KNOWS |= {
    "cache",
    "past_key_values",
    "past_key_value",
    "cache_position",
    "use_cache",
    "output_attentions",
    "shared_kv_states",
}


#: a block input named as another sequence's states or a whole-sequence summary: never cut as the hidden states are
_OTHER_SEQUENCE = ("encoder", "cross", "context", "global")


def _block_inputs(blocks: list, split: tuple[str, ...]) -> tuple[str, ...]:
    """The tensors a block's forward takes (by its signature) besides what it is known to take and the
    keywords ``split`` cuts (Gemma 4's ``per_layer_input``), by parameter name."""
    import inspect

    found = []
    for cls in dict.fromkeys(type(b) for _, b in blocks):
        try:
            params = inspect.signature(cls.forward).parameters
        except (TypeError, ValueError):
            continue
        found += [
            n
            for n, p in params.items()
            if n not in _BLOCK_KNOWS and n not in split and not n.endswith("mask") and "Tensor" in str(p.annotation)
        ]
    return tuple(dict.fromkeys(found))


def _residual_dropouts(blocks: list) -> tuple[str, ...]:
    """The dropout modules that are a block's own children (on the residual stream, split under
    ``split_gather``: each rank then drops its own tokens)."""
    return tuple(dict.fromkeys(n for _, b in blocks[:1] for n, m in b.named_children() if isinstance(m, nn.Dropout)))


def _handed_on(cls: type, container: str) -> list[str]:
    """What the base model's forward takes from each block of ``container`` besides the hidden states
    (``hidden_states, topk_indices = layer(...)``: GLM-MoE-DSA's indexer shares its choice with the next
    layer), read from its source; none when it cannot be read."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls.forward)))
    except (OSError, TypeError, SyntaxError):
        return []
    over = (n for n in ast.walk(tree) if isinstance(n, ast.For))
    for loop in (n for n in over if any(getattr(a, "attr", None) == container for a in ast.walk(n.iter))):
        names = {t.id for t in ast.walk(loop.target) if isinstance(t, ast.Name)}
        for node in ast.walk(loop):
            call = node.value if isinstance(node, ast.Assign) else None
            if isinstance(call, ast.Call) and ast.unparse(call.func) in names:
                targets = node.targets[0]
                if isinstance(targets, ast.Tuple) and len(targets.elts) > 1:
                    return [ast.unparse(t) for t in targets.elts[1:]]
    return []


def _under(path: str, module: str) -> bool:
    return path == module or path.startswith(f"{module}.")


def _sinks(model: nn.Module) -> list[str]:
    """The attention modules holding per-head sinks (GPT-OSS's ``sinks``, one logit a head)."""
    return [n for n, m in model.named_modules() if isinstance(getattr(m, "sinks", None), nn.Parameter)]


class ShippedPlanPolicy(HFStages, PlanPolicy):
    """The zero-config policy: the TP plan the model ships, pipeline stages from its pipeline plan, and
    Ulysses and the ring through transformers' attention registry."""

    @property
    def base(self) -> nn.Module:
        return self.model.base_model

    def stages(self) -> StageFacts:
        return shipped_stage_facts(self.model, self.base, self.blocks())

    def sequence(self) -> SequenceSpec:
        """A decoder's sequence split over ``sp`` ranks: the attention switched in transformers' registry
        (Ulysses: whole heads a rank, the head counts from the config; the ring: what it does not compute,
        sliding windows and soft-capping, over gathered keys and values), the rotary embeddings split with
        the hidden states; Megatron's ``split_gather`` over the TP plan's region, where the attention
        module sees the whole sequence (so also where only Ulysses and the ring are refused). Nothing
        declared for a composite (its towers' attention differs)."""
        config = self.model.config
        if getattr(config, "sub_configs", None):
            return SequenceSpec()
        mixers, inputs = token_mixers(config, self.blocks()), _block_inputs(self.blocks(), self._along())
        why = self._not_split(mixers.why, inputs)
        heads = None if why else sequence_heads(config)
        if why is None and heads is None:
            return SequenceSpec()
        return SequenceSpec(
            modes=("split_gather",) if why else ("split_gather", "all_to_all", "ring_attn"),
            refused={"all_to_all": why, "ring_attn": why} if why else {},
            split_kwargs=self._along(),
            # per position, read per position as the hidden states are (DeepSeek-V4's input_ids: its hash routing)
            block_inputs=inputs,
            gathered=() if why else mixers.gathered,
            mask_builders=() if why else tuple(f"{n}.{m}" for n, m in mask_builders(self.model)),
            unmixed=() if why else mixers.unmixed,
            # transformers leaves _supports_attention_backend unset on a hybrid for its mixers, run gathered here;
            # its attention modules read the registry (each forward counts their calls: never silently skipped)
            routed=not why and bool(mixers.gathered),
            heads=heads,
            per_head=("sinks", "s_aux") if _sinks(self.model) else (),  # one logit a head: a rank's heads' own
            dropouts=_residual_dropouts(self.blocks()),
            attention_problem=self._sequence_problem,
        )

    def _along(self) -> tuple[str, ...]:
        """The blocks' keywords split with the hidden states: the rotary embeddings, and what an attention module
        takes along the sequence besides (Ministral 3's position_ids, Beam's attention_scaling: per-position
        query scales)."""
        return ("position_embeddings", *dict.fromkeys(name for _, name in tensor_inputs(self.model)))

    def _sequence_problem(self, mode: str) -> str | None:
        if mode == "split_gather":
            plans = getattr(self, "_plans", None)
            plans = plans if plans is not None else self._layers()
            return region_problem(self.blocks(), plans, self.tensor_parallel().grad_sum)
        return attention_registry().sequence_problem(self.model, mode, routed=self.sequence().routed)

    def _not_split(self, mixers_problem: str | None, inputs: tuple[str, ...]) -> str | None:
        """Why the model's attention cannot run with its sequence split (``None``: nothing seen);
        ``mixers_problem``: why its token mixers outside the attention cannot (:func:`token_mixers`); ``inputs``:
        the blocks' own tensor inputs (:func:`_block_inputs`)."""
        config = self.model.config
        try:
            sequence_heads(config)  # a config with per-layer shapes: each layer's
        except (AttributeError, RuntimeError) as err:
            said = str(err).split(".")[0]
            return f"{type(config).__name__} gives its layers their own attention shapes ({said}), not read per layer"
        if mixers_problem:
            return mixers_problem
        other = [n for n in inputs if any(w in n for w in _OTHER_SEQUENCE)]
        if other:
            return (
                f"its blocks take {other[0]!r} besides the hidden states, named as another sequence's states or the "
                "whole one's, which the split neither cuts nor knows to be whole"
            )
        biases = bias_passers(self.model)
        if biases:
            return (
                f"{biases[0][0]} hands the attention function a {biases[0][1]!r} computed over a rank's part of the "
                "queries and every head, which the split cuts neither along"
            )
        built = {(type(self.model.get_submodule(n)).__name__, f"{m}()") for n, m in mask_builders(self.model)}
        readers = [r for r in mask_readers(self.model) if r[:2] not in built]  # a mask builder runs whole
        if readers:
            cls, what, line = readers[0]
            return (
                f"{cls} uses the attention mask besides handing it to the attention function ({what}, line {line} of "
                "its forward: a sparse-attention indexer or its own mask), where a rank holds part of the queries"
            )
        return None

    # -- expert parallelism: the experts modules the config's base_model_ep_plan dispatches tokens to --

    def _dispatched(self) -> list[str]:
        """The experts modules the config's ``base_model_ep_plan`` gives ``ep_dispatch_experts``."""
        plan = getattr(self.model.config, "base_model_ep_plan", None) or {}
        prefix = next((f"{n}." for n, m in self.model.named_modules() if m is self.base and n), "")
        keys = [_regex(prefix + k) for k, style in plan.items() if style == "ep_dispatch_experts"]
        return [n for n, _ in self.model.named_modules() if n and any(k.match(n) for k in keys)]

    def experts(self) -> ExpertSpec:
        """Expert parallelism where the config's expert plan names the experts modules (transformers 5's
        fused experts, every parameter one slice per expert: GPT-OSS's biases too); else refused."""
        if not self._dispatched():
            config = type(self.model.config).__name__
            return ExpertSpec(
                refusal=f"splits a plan's fused experts by tensor parallelism (moe_tp_experts) only: {config} ships "
                "no base_model_ep_plan naming the experts modules to route tokens to (ep_dispatch_experts)"
            )
        return ExpertSpec(supported=True)

    def module_policy(self):
        """The TP plan's layers (under ``split_gather`` the column-parallel layers' parents enter the
        region: :func:`~shardcore.plan.region.region_entries`); under expert parallelism the experts modules the expert plan names
        become :class:`~shardcore.expert_parallel.experts.ExpertsEP` (whole experts over the ``ep x tp``
        ranks) in place of what the TP plan does to them."""
        policy = super().module_policy()
        config = self.shard_config
        if config.enable_sequence_parallelism and config.sequence_parallelism_mode == "split_gather":
            own = policy[type(self.model)]
            entries, subs = region_entries(own.sub_module_replacement, self.blocks())
            policy[type(self.model)] = attrs.evolve(own, sub_module_replacement=subs, enter_tp_region=entries)
        if config.expert_parallel_size == 1:
            return policy
        from ..expert_parallel.experts import ExpertsEP

        dispatched = self._dispatched()
        own = policy[type(self.model)]
        kept = [s for s in own.sub_module_replacement if not any(_under(s.suffix, d) for d in dispatched)]
        if self.tp_size == 1:  # the experts alone: the rest whole, data-parallel
            own, kept = ModulePolicyDescription(), []
        routed = [Sub(suffix=d, target_module=ExpertsEP, kwargs={"layout": self.layout}) for d in dispatched]
        return {type(self.model): attrs.evolve(own, sub_module_replacement=kept + routed)}
