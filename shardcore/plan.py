"""Sharding plans: which parameter is split along which mesh axis, declared in YAML or a dict.

The syntax is torchprime's: each top-level key is a state-dict parameter name, ``*`` matching
any layer index, and its value a partition spec, one entry per dimension: a mesh axis name
(``tp``, ``dp``) or ``null`` (that dimension is replicated)::

    model.embed_tokens.weight: [tp, null]               # vocab parallel
    model.layers.*.self_attn.q_proj.weight: [tp, null]  # column parallel
    model.layers.*.self_attn.o_proj.weight: [null, tp]  # row parallel
    lm_head.weight: [tp, null]                          # vocab-parallel head
    model.layers.*.mlp.up_proj.weight: [tp, dp]         # column parallel, FSDP splits dim 1

``dp`` names the dimension FSDP splits a parameter along over the data-parallel ranks (with
``ShardConfig(data_parallel="fsdp")``, which splits every parameter, along dim 0 unless the plan
says otherwise); one dimension per axis.

A replicated parameter that acts on split activations (a norm over each head's features) takes
the spec ``replicated_with_grad_allreduce`` (transformers' name): its gradient is summed over
the group. A key naming a module instead (``model.layers.*.mlp``, ``name[i]`` for element ``i`` of a tuple
output) is an activation spec: the layout of that module's output, which shardcore's layers
decide; it is checked against them (a disagreement is an error), never ignored.

:class:`PlanPolicy` turns a plan into a :class:`~shardcore.Policy` made of shardcore's own
parallel layers: ``nn.Embedding`` ``[tp, null]`` -> vocab-parallel embedding; the model's output
embedding (or a Linear tied to an embedding) ``[tp, null]`` -> vocab-parallel LM head (full
logits); ``nn.Linear`` ``[tp, null]`` ->
column parallel, ``[null, tp]`` -> row parallel, split by attention heads when the parent module
has a ``head_dim`` (KV heads fewer than the group are replicated, as the plugins do). Column
layers reading one tensor share one backward all-reduce, so a plan costs the same collectives as
a plugin. Every key must match something, every split must divide, every axis must be known: all
checked in :meth:`PlanPolicy.config_sanity_check`, before any collective.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from .policy import ModulePolicyDescription, Policy
from .policy import SubModuleReplacementDescription as Sub
from .tensor_parallel import Linear1D_Col, Linear1D_Row, VocabParallelEmbedding1D, VocabParallelLMHead1D

__all__ = ["PlanError", "PlanPolicy", "hf_tp_plan", "load_plan", "zero_config_policy"]

#: Mesh axes a spec may name: ``tp`` (shardcore's parallel layers) and ``dp`` (the dimension FSDP
#: splits the parameter along over the data-parallel ranks, with ``ShardConfig(data_parallel="fsdp")``).
AXES = ("dp", "tp")
#: The spec of a replicated parameter that acts on split activations (a norm over each head's
#: features): its gradient is summed over the group. transformers' name for it.
GRAD_SUM = "replicated_with_grad_allreduce"
_INDEX = re.compile(r"^(?P<name>.*?)(\[(?P<i>\d+)\])?$")
_HEAD_ATTRS = ("num_heads", "num_attention_heads", "num_key_value_heads")


class PlanError(ValueError):
    """A sharding plan that cannot be applied: the message names the key (and its line)."""


class _Plan:
    def __init__(
        self, specs: dict[str, list | None], lines: dict[str, int], source: str, dp: dict[str, int] | None = None
    ) -> None:
        #: the tensor-parallel specs (``dp`` entries read as null) and ``{key: dim}`` of the ``dp`` entries
        self.specs, self.lines, self.source, self.dp = specs, lines, source, dp or {}

    def where(self, key: str) -> str:
        line = self.lines.get(key)
        return f"{self.source}:{line}" if line else self.source


def load_plan(plan: str | Path | Mapping[str, Any]) -> _Plan:  # noqa: C901, PLR0912
    """Read and check the syntax of a plan (a YAML path or a mapping); no model needed yet."""
    if isinstance(plan, Mapping):
        data, lines, source = dict(plan), {}, "plan"
    else:
        path = Path(plan)
        try:
            import yaml
        except ImportError as err:
            raise PlanError(
                "YAML plans need PyYAML: pip install 'shardcore[yaml]' (or pass the plan as a dict)"
            ) from err
        try:
            text = path.read_text()
        except OSError as err:
            raise PlanError(f"cannot read the sharding plan {str(path)!r}: {err}") from err
        source = str(path)
        try:
            data = yaml.safe_load(text)
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            at = f":{mark.line + 1}" if mark is not None else ""
            problem = getattr(err, "problem", None) or str(err)
            raise PlanError(f"{source}{at}: malformed YAML: {problem}") from err
        lines = {}
        if root is not None and isinstance(root, yaml.MappingNode):
            lines = {k.value: k.start_mark.line + 1 for k, _ in root.value}
        if data is None:
            data = {}
    if not isinstance(data, dict):
        raise PlanError(
            f"{source}: a sharding plan is a mapping of parameter names to specs, got {type(data).__name__}"
        )
    specs: dict[str, list | None] = {}
    dp: dict[str, int] = {}
    for key, spec in data.items():
        at = f"{source}:{lines[key]}" if key in lines else source
        if not isinstance(key, str):
            raise PlanError(f"{at}: key {key!r} is not a parameter or module name")
        if spec == GRAD_SUM:
            specs[key] = GRAD_SUM
            continue
        if spec is not None and not (
            isinstance(spec, list | tuple) and all(a is None or isinstance(a, str) for a in spec)
        ):
            raise PlanError(
                f"{at}: {key!r}: a spec is a list of mesh axis names or null (or {GRAD_SUM!r}), got {spec!r}"
            )
        for axis in spec or ():
            if axis is None:
                continue
            if axis not in AXES:
                raise PlanError(
                    f"{at}: {key!r}: unknown mesh axis {axis!r}; shardcore's axes are {', '.join(AXES)} "
                    "(or null for a replicated dimension)"
                )
        for axis in AXES:
            if spec is not None and sum(a == axis for a in spec) > 1:
                raise PlanError(f"{at}: {key!r}: {list(spec)} splits more than one dimension over {axis}")
        if spec is not None and "dp" in spec:
            dp[key] = list(spec).index("dp")
        specs[key] = None if spec is None else [None if a == "dp" else a for a in spec]
    return _Plan(specs, lines, source, dp)


def _regex(key: str) -> re.Pattern:
    return re.compile("^" + re.escape(key).replace(r"\*", r"\d+") + "$")


class PlanPolicy(Policy):
    """The policy a sharding plan describes (see the module docstring)."""

    def __init__(self, plan: str | Path | Mapping[str, Any] | _Plan) -> None:
        self.plan = plan if isinstance(plan, _Plan) else load_plan(plan)
        self._grad_sum: list[str] = []

    # -- matching ------------------------------------------------------------------------------

    def _resolve(self) -> dict[str, tuple[str, list | None]]:
        """``{parameter name: (key, spec)}`` for every split parameter; every key checked."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        modules = dict(self.model.named_modules())
        out: dict[str, tuple[str, list | None]] = {}
        self._activations: list[tuple[str, str, int | None, list | None]] = []
        for key, spec in self.plan.specs.items():
            regex = _regex(key)
            hits = [n for n in params if regex.match(n)]
            if hits:
                for name in hits:
                    if name in out:
                        raise PlanError(
                            f"{self.plan.where(key)}: {key!r} and {out[name][0]!r} both match {name}; "
                            "give each parameter one spec"
                        )
                    out[name] = (key, spec)
                continue
            m = _INDEX.match(key)
            mod_regex = _regex(m.group("name"))
            mod_hits = [n for n in modules if n and mod_regex.match(n)]
            if mod_hits:
                index = int(m.group("i")) if m.group("i") is not None else None
                self._activations += [(key, n, index, spec) for n in mod_hits]
                continue
            flat = [re.sub(r"\.\d+\.", ".*.", n) for n in [*params, *modules]]
            close = difflib.get_close_matches(key, dict.fromkeys(flat), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PlanError(
                f"{self.plan.where(key)}: {key!r} matches no parameter or module of {type(self.model).__name__}{hint}"
            )
        return out

    def _layers(self) -> dict[str, tuple[type, dict, str]]:  # noqa: C901, PLR0912, PLR0915
        """``{module path: (parallel layer class, kwargs, key)}``, every split checked against the model."""
        tp, name = self.tp_size, type(self.model).__name__
        resolved = self._resolve()
        modules = dict(self.model.named_modules())
        head = self.model.get_output_embeddings() if hasattr(self.model, "get_output_embeddings") else None
        embeddings = {id(m.weight) for m in modules.values() if isinstance(m, nn.Embedding)}
        plans: dict[str, tuple[type, dict, str]] = {}
        by_module: dict[str, dict[str, tuple[str, list | None]]] = {}
        self._check_ties(resolved)
        self._grad_sum = [n for n, (_, spec) in resolved.items() if spec == GRAD_SUM]
        for pname, (key, spec) in resolved.items():
            mod_path, _, attr = pname.rpartition(".")
            by_module.setdefault(mod_path, {})[attr] = (key, None if spec == GRAD_SUM else spec)
        for mod_path, entries in by_module.items():
            module = modules[mod_path]
            weight_key, weight_spec = entries.get("weight", (None, None))
            at = self.plan.where(weight_key or next(iter(entries.values()))[0])
            param = getattr(module, "weight", None)
            if weight_key is None or weight_spec is None or all(a is None for a in weight_spec):
                if any(s and any(a is not None for a in s) for _, s in entries.values()):
                    raise PlanError(
                        f"{at}: {mod_path}: a bias can only be split with its weight; give {mod_path}.weight a spec"
                    )
                continue  # replicated
            if len(weight_spec) != param.dim():
                raise PlanError(
                    f"{at}: {mod_path}.weight has {param.dim()} dimensions {tuple(param.shape)}, "
                    f"the spec {weight_spec} has {len(weight_spec)}"
                )
            dim = next(i for i, a in enumerate(weight_spec) if a is not None)
            bias_key, bias_spec = entries.get("bias", (None, None))
            plain = (nn.Embedding, nn.Linear)
            if isinstance(module, plain) and not any(type(module).forward is c.forward for c in plain):
                raise PlanError(
                    f"{at}: {mod_path} is a {type(module).__name__}, whose forward differs from torch's "
                    f"(e.g. scales its output); a plan splits plain nn.Linear / nn.Embedding layers: give it null "
                    "(replicated) or write a policy"
                )
            if isinstance(module, nn.Embedding):
                if dim != 0:
                    raise PlanError(
                        f"{at}: {mod_path}.weight {weight_spec}: shardcore splits embeddings over the vocabulary "
                        "(dim 0: [tp, null]), not over the embedding width"
                    )
                plans[mod_path] = (
                    VocabParallelEmbedding1D,
                    {"make_vocab_size_divisible_by": self._vocab_pad()},
                    weight_key,
                )
                continue
            if not isinstance(module, nn.Linear):
                raise PlanError(
                    f"{at}: {mod_path} is a {type(module).__name__}; a plan splits nn.Linear and nn.Embedding "
                    "parameters (write a policy for other layers)"
                )
            column = dim == 0
            if bias_spec is not None and module.bias is not None:
                expected = [weight_spec[0]] if column else [None]
                if list(bias_spec) != expected:
                    raise PlanError(
                        f"{self.plan.where(bias_key)}: {mod_path}.bias {bias_spec}: with the weight {weight_spec} "
                        f"the bias must be {expected}"
                    )
            if column and (module is head or id(module.weight) in embeddings):  # the output embedding
                plans[mod_path] = (
                    VocabParallelLMHead1D,
                    {"gather_output": True, "make_vocab_size_divisible_by": self._vocab_pad()},
                    weight_key,
                )
                continue
            size = module.out_features if column else module.in_features
            parent = modules[mod_path.rpartition(".")[0]]
            head_dim = getattr(parent, "head_dim", None)
            kwargs: dict[str, Any] = {}
            if isinstance(head_dim, int) and head_dim > 0 and size % head_dim == 0:
                heads = size // head_dim
                if heads % tp and tp % heads:
                    raise PlanError(
                        f"{at}: {mod_path}.weight dim {dim}: {heads} heads of {head_dim} can neither be split over "
                        f"nor replicated on tp={tp}"
                    )
                if not column and heads < tp:
                    raise PlanError(f"{at}: {mod_path}.weight dim {dim}: {heads} heads cannot be split over tp={tp}")
                kwargs = {"num_heads": heads, "head_dim": head_dim}
            elif size % tp:
                raise PlanError(
                    f"{at}: {mod_path}.weight dim {dim} has size {size}, not divisible by tp={tp} "
                    f"(in {name}); use a tensor_parallel_size that divides {size}"
                )
            plans[mod_path] = ((Linear1D_Col if column else Linear1D_Row), kwargs, weight_key)
        return plans

    def _check_ties(self, resolved: dict[str, tuple[str, list | None]]) -> None:
        """Tied parameters (an LM head sharing the embedding) must be split alike."""
        names: dict[int, list[str]] = {}
        for n, p in self.model.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(n)
        for tied in (v for v in names.values() if len(v) > 1):
            specs = {n: (resolved[n][1] if n in resolved else None) for n in tied}
            split = {n: s for n, s in specs.items() if isinstance(s, list) and any(a is not None for a in s)}
            if split and (len(split) != len(tied) or len({tuple(s) for s in split.values()}) > 1):
                key = next(resolved[n][0] for n in split)
                raise PlanError(
                    f"{self.plan.where(key)}: {', '.join(tied)} are one tied parameter; give each of them the same "
                    f"spec (now {specs})"
                )

    def _vocab_pad(self) -> int:
        return self.shard_config.make_vocab_size_divisible_by

    def _check_activations(self, plans: dict[str, tuple[type, dict, str]]) -> None:
        for key, path, index, spec in self._activations:
            layer = plans.get(path, (None,))[0]
            split_last = layer is Linear1D_Col  # a column layer's output stays split over tp
            if spec is None:
                continue
            if spec == GRAD_SUM:
                raise PlanError(f"{self.plan.where(key)}: {key!r}: {GRAD_SUM} is a parameter spec; {path} is a module")
            expected = "split over tp on its last dimension" if split_last else "replicated (all null)"
            given_split = [i for i, a in enumerate(spec) if a is not None]
            ok = (given_split == [len(spec) - 1]) if split_last else not given_split
            if not ok:
                at = f"{path}[{index}]" if index is not None else path
                raise PlanError(
                    f"{self.plan.where(key)}: {key!r}: {at}'s output is {expected} under this plan, "
                    f"the activation spec says {spec}"
                )

    # -- the Policy interface --------------------------------------------------------------------

    share_tp_copies = True  # column layers reading one tensor share one backward all-reduce

    def blocks(self):
        plans = self._plans if getattr(self, "_plans", None) is not None else {}
        names = list(plans) or [n for n, _ in self.model.named_parameters()]
        for container in self.model.modules():
            if isinstance(container, nn.ModuleList) and len(container):
                blocks = self.blocks_in(container)
                if any(any(n.startswith(b + ".") for n in names) for b, _ in blocks):
                    return blocks
        return []

    def config_sanity_check(self) -> None:
        self._plans = self._layers()
        self._check_activations(self._plans)
        self._dp_dims = self._data_parallel_dims()

    def _data_parallel_dims(self) -> dict[str, int]:
        """``{parameter name: dim}`` of the plan's ``dp`` entries, checked against the config and
        the parameters (a ``dp`` entry of an activation spec says the batch is split: nothing to do)."""
        if not self.plan.dp:
            return {}
        mode = getattr(self.shard_config, "data_parallel", None)
        if mode != "fsdp":
            key = next(iter(self.plan.dp))
            raise PlanError(
                f"{self.plan.where(key)}: {key!r}: the axis 'dp' splits parameters over the data-parallel ranks, "
                f"which FSDP does: set ShardConfig(data_parallel='fsdp') (it is {mode!r}), or write null"
            )
        params = dict(self.model.named_parameters(remove_duplicate=False))
        dims: dict[str, int] = {}
        for key, dim in self.plan.dp.items():
            regex = _regex(key)
            for name in (n for n in params if regex.match(n)):
                if dim >= params[name].dim():
                    raise PlanError(
                        f"{self.plan.where(key)}: {name} has {params[name].dim()} dimensions, the spec puts dp on dim {dim}"
                    )
                dims[name] = dim
        return dims

    def data_parallel_shard_dims(self) -> dict[str, int]:
        """The dimension FSDP splits each parameter the plan gives a ``dp`` entry along."""
        return dict(getattr(self, "_dp_dims", {}))

    def module_policy(self):
        plans = self._plans if getattr(self, "_plans", None) is not None else self._layers()
        tp = self.tp_size
        subs = [Sub(suffix=path, target_module=cls, kwargs=kwargs) for path, (cls, kwargs, _) in plans.items()]
        attributes: dict[str, int] = {}
        per_rank = []
        modules = dict(self.model.named_modules())
        parents: dict[str, list[tuple[str, dict]]] = {}
        for path, (cls, kwargs, _) in plans.items():
            if cls is Linear1D_Col and "num_heads" in kwargs:
                parents.setdefault(path.rpartition(".")[0], []).append((path, kwargs))
        for parent_path, cols in parents.items():
            parent = modules[parent_path]
            heads = max(k["num_heads"] for _, k in cols)
            kv = min(k["num_heads"] for _, k in cols)
            local_q, local_kv = heads // tp, max(kv // tp, 1)
            for attr in _HEAD_ATTRS:
                value = getattr(parent, attr, None)
                if isinstance(value, int) and value in (heads, kv):
                    attributes[f"{parent_path}.{attr}"] = local_q if value == heads else local_kv
            if isinstance(getattr(parent, "num_key_value_groups", None), int):
                attributes[f"{parent_path}.num_key_value_groups"] = local_q // local_kv
            per_rank.append(parent_path)  # attention over this rank's heads: dropout per rank
        return {
            type(self.model): ModulePolicyDescription(
                attribute_replacement=attributes, sub_module_replacement=subs, per_rank_rng=per_rank
            )
        }

    @property
    def grad_sum_parameters(self) -> list[str]:
        """Names of the parameters given ``replicated_with_grad_allreduce`` (known after the checks)."""
        return list(self._grad_sum)

    def postprocess(self):
        """Sum over the group the gradients of the parameters given ``replicated_with_grad_allreduce``;
        a causal LM's loss on the vocabulary slices while its logits are gathered (:func:`~shardcore.losses.defer_logits_gather`)."""
        from .losses import defer_logits_gather

        get_head = getattr(self.model, "get_output_embeddings", None)
        defer_logits_gather(self.model, get_head() if callable(get_head) else None)
        if self._grad_sum:
            from .distributed.collectives import all_reduce
            from .tensor_parallel.parallel_module import ParallelModule

            group = next(m.process_group for m in self.model.modules() if isinstance(m, ParallelModule))
            params = dict(self.model.named_parameters(remove_duplicate=False))
            for name in self._grad_sum:
                where = f"backward of {name} (gradient summed over the group)"
                params[name].register_hook(
                    lambda g, where=where: all_reduce(g.contiguous().clone(), group, where=where)
                )
        return self.model


# -- zero-config: the plan a HuggingFace model ships ---------------------------------------------------

#: transformers' tensor-parallel styles the fallback turns into specs.
_STYLES = {"colwise": ["tp", None], "rowwise": [None, "tp"]}


def hf_tp_plan(model: nn.Module) -> dict[str, list | str | None] | None:
    """The plan a HuggingFace model's ``config.base_model_tp_plan`` describes, in shardcore's syntax
    (each parameter of a ``replicated_with_grad_allreduce`` module gets that spec); ``None`` if the
    model ships no plan. The embedding and the LM head are split over the vocabulary too
    (transformers keeps them replicated) when they are plain ``nn.Embedding`` / ``nn.Linear``."""
    config = getattr(model, "config", None)
    base_plan = getattr(config, "base_model_tp_plan", None)
    if not base_plan:
        return None
    base = getattr(model, "base_model", model)
    paths = {id(m): n for n, m in model.named_modules()}
    prefix = paths.get(id(base), "")
    prefix = f"{prefix}." if prefix else ""
    specs: dict[str, list | str | None] = {}
    for pattern, style in base_plan.items():
        if style in _STYLES:
            specs[f"{prefix}{pattern}.weight"] = list(_STYLES[style])
        elif style == GRAD_SUM:
            regex = _regex(f"{prefix}{pattern}")
            module = next((m for n, m in model.named_modules() if regex.match(n)), None)
            for pname, _ in module.named_parameters(recurse=False) if module is not None else ():
                specs[f"{prefix}{pattern}.{pname}"] = GRAD_SUM
        else:
            raise PlanError(
                f"{type(model).__name__}: base_model_tp_plan gives {pattern!r} the style {style!r}, which shardcore's "
                f"zero-config fallback does not translate (colwise, rowwise and {GRAD_SUM} are); "
                "write a plan (shardcore plan MODEL writes one to start from) or a plugin"
            )
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    ends = [m for m in (embed, head) if m is not None]
    tied = head is not None and embed is not None and head.weight is embed.weight
    plain = all(type(m).forward in (nn.Embedding.forward, nn.Linear.forward) for m in ends)
    if plain or not tied:  # a tied pair is split together or not at all
        for m in ends:
            if type(m).forward in (nn.Embedding.forward, nn.Linear.forward) and id(m) in paths:
                specs[f"{paths[id(m)]}.weight"] = ["tp", None]
    return specs


def zero_config_policy(model: nn.Module) -> PlanPolicy | None:
    """The fallback policy for a model no plugin covers: its HuggingFace TP plan, if it ships one."""
    specs = hf_tp_plan(model)
    if specs is None:
        return None
    return PlanPolicy(_Plan(specs, {}, f"{type(model).__name__}.config.base_model_tp_plan"))
