"""PlanPolicy: a plan applied to a model with shardcore's own parallel layers."""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from ..inputs import find_inputs
from ..policy import ModulePolicyDescription, Policy, blocks_in
from ..policy import SubModuleReplacementDescription as Sub
from ..spec import ChecksSpec, DataParallelSpec, ExpertSpec, TensorParallelSpec
from ..tensor_parallel import InPlace, Linear1D_Col
from .flow import check_activations, leaving, repeated, roles
from .layers import Layers, splits_heads
from .registry import Site
from .styles import config_of, linear_spec, module_layer, param_split, unchosen_experts
from .syntax import _HEAD_ATTRS, _INDEX, GRAD_SUM, PlanError, _Plan, _regex, load_plan

log = logging.getLogger("shardcore")


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
        self._styles: dict[str, tuple[str, str]] = {}  # {module path: (key, style)}
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
            if mod_hits and isinstance(spec, str) and m.group("i") is None:  # a style for the module
                for path in mod_hits:
                    if spec == GRAD_SUM:
                        for pname, _ in modules[path].named_parameters(recurse=False):
                            out[f"{path}.{pname}"] = (key, GRAD_SUM)
                    else:
                        self._styles[path] = (key, spec)
                continue
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

    def _layers(self) -> dict[str, tuple[type, dict, str]]:
        """``{module path: (parallel layer class, kwargs, key)}``, every split checked against the model."""
        resolved = self._resolve()
        modules = dict(self.model.named_modules())
        self._check_ties(resolved)
        self._grad_sum = [n for n, (_, spec) in resolved.items() if spec == GRAD_SUM]
        by_module, in_place = self._entries(resolved, modules)
        heads = self._heads(by_module, modules)
        layers = Layers(self.plan, self.tp_size, type(self.model).__name__, self._vocab_pad())
        parallel_output = bool(getattr(self.shard_config, "parallel_output", False))
        plans: dict[str, tuple[type, dict, str]] = {}
        for mod_path, entries in by_module.items():
            parent = modules[mod_path.rpartition(".")[0]]
            layer = layers.layer(mod_path, modules[mod_path], entries, parent, mod_path in heads, parallel_output)
            if layer is not None:
                plans[mod_path] = layer
        self._style_layers(plans, in_place, modules)
        for path, entry in in_place.items():
            key = entry.pop("_key")
            plans[path] = (InPlace, entry, key)
        return plans

    def _entries(self, resolved: dict, modules: dict) -> tuple[dict[str, dict], dict[str, dict]]:
        """``({module path: {"weight": (key, spec), ...}}, {module path: InPlace kwargs})``: the
        parameters' specs by module, and the bare parameters a style cuts in place."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        by_module: dict[str, dict[str, tuple[str, list | None]]] = {}
        in_place: dict[str, dict] = {}  # {module path: InPlace kwargs}: bare parameters cut, hooks
        for pname, (key, spec) in resolved.items():
            mod_path, _, attr = pname.rpartition(".")
            spec = linear_spec(self.plan.where(key), pname, modules[mod_path], spec)
            if isinstance(spec, str):  # a style for a bare parameter (fused experts, a per-head vector)
                split = param_split(self.plan.where(key), pname, params[pname], spec)
                if split is not None:
                    entry = in_place.setdefault(mod_path, {"where": mod_path, "params": {}, "_key": key})
                    entry["params"][attr] = split
                continue
            by_module.setdefault(mod_path, {})[attr] = (key, None if spec == GRAD_SUM else spec)
        return by_module, in_place

    def _heads(self, by_module: dict[str, dict], modules: dict) -> set[str]:
        """The column-split linears whose output leaves the model (the output embedding, one tied to an input
        embedding, any other it returns: :mod:`.flow`): split over the vocabulary (padded), gathered unless ``parallel_output``."""
        get_head = getattr(self.model, "get_output_embeddings", None)
        head = get_head() if callable(get_head) else None
        embeddings = {id(m.weight) for m in modules.values() if isinstance(m, nn.Embedding)}
        heads = {p for p in by_module if modules[p] is head or id(getattr(modules[p], "weight", None)) in embeddings}
        columns, rows = roles(by_module, self._styles, modules)
        if getattr(self, "_leaving", (None,))[0] is not self.model:  # the model runs once, whatever the layout
            inputs, why_not = find_inputs(self.model, getattr(self.shard_config, "example_inputs", None))
            self._leaving = (self.model, *leaving(self.model, columns, rows, inputs, why_not))
        _, found, how = self._leaving
        by_heads = {p for p in found if splits_heads(modules[p], modules[p.rpartition(".")[0]])}
        leave = (found & set(by_module)) - by_heads - heads
        if leave:
            log.info(
                "shardcore: %s: %s leave the model: split over the vocabulary (found by %s)",
                type(self.model).__name__,
                ", ".join(sorted(leave)),
                how,
            )
        return heads | leave

    def _style_layers(self, plans: dict, in_place: dict, modules: dict) -> None:
        """The layers of the modules given one of transformers' styles, into ``plans`` / ``in_place``."""
        for path, (key, style) in self._styles.items():
            if path in plans:
                raise PlanError(
                    f"{self.plan.where(key)}: {path} has the style {style!r} and its parameters a spec "
                    f"({plans[path][2]!r}); give it one or the other"
                )
            parent = modules.get(path.rpartition(".")[0])
            config = config_of(path, modules, self.model)
            site = Site(self.plan.where(key), path, modules[path], parent, config, self._vocab_pad())
            layer = module_layer(site, style)
            if layer is None:
                continue
            cls, kwargs = layer
            if cls is InPlace:
                entry = in_place.setdefault(path, {"where": path, "params": {}, "_key": key})
                entry.update(kwargs)
            else:
                plans[path] = (cls, kwargs, key)

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

    # -- the Policy interface --------------------------------------------------------------------

    def tensor_parallel(self) -> TensorParallelSpec:
        return TensorParallelSpec(
            parallel_output=True,  # the splits leaving the model stay split, marked (VocabSlice)
            share_copies=True,  # column layers reading one tensor share one backward all-reduce
            grad_sum=self._grad_sum,  # replicated_with_grad_allreduce (known after the checks)
        )

    def experts(self) -> ExpertSpec:
        return ExpertSpec(
            refusal="splits a plan's fused experts by tensor parallelism (moe_tp_experts), not over expert-parallel "
            "ranks (not built for plans); a plugin whose policy routes experts does that (shard-moe)"
        )

    def checks(self) -> ChecksSpec:
        return ChecksSpec(blocks=self._planned_blocks())

    def data_parallel(self) -> DataParallelSpec:
        """FSDP's split dims from the plan's ``dp`` entries; DDP finds what a step leaves without a gradient."""
        why = unchosen_experts(getattr(self, "_styles", {}))  # FSDP refused beside zero-computation experts
        return DataParallelSpec(shard_dims=getattr(self, "_dp_dims", {}), find_unused=True, sharded_refusal=why)

    def blocks(self):
        """The first repeated container's blocks holding a planned module, else a parameter (GPT-OSS's
        plan names only its ends: its layers are still FSDP's blocks)."""
        plans = self._plans if getattr(self, "_plans", None) is not None else {}
        for names in (list(plans), [n for n, _ in self.model.named_parameters()]):
            for container in self.model.modules():
                blocks = blocks_in(self.model, container) if repeated(container) else []
                if any(any(n == b or n.startswith(b + ".") for n in names) for b, _ in blocks):
                    return blocks
        return []

    def _planned_blocks(self) -> list[tuple[str, nn.Module]]:
        """The blocks of every outermost repeated container (``nn.ModuleList``, or ``nn.Sequential`` of one
        class: :func:`~shardcore.plan.flow.repeated`) holding a planned module (a composite's
        towers and language model alike): what ``ShardConfig(verify=...)`` checks."""
        names = list(self._plans if getattr(self, "_plans", None) is not None else {})
        found: list[tuple[str, nn.Module]] = []
        for path, container in self.model.named_modules():
            if not repeated(container):
                continue
            if any(path.startswith(f"{b}.") for b, _ in found):
                continue  # inside a block already chosen
            blocks = blocks_in(self.model, container)
            if any(any(n == b or n.startswith(b + ".") for n in names) for b, _ in blocks):
                found += blocks
        return found

    def config_sanity_check(self) -> None:
        self._plans = self._layers()
        check_activations(self.plan, self._activations, self._plans)
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

    def postprocess(self):
        """A HuggingFace causal LM's loss on the vocabulary slices while its logits are gathered
        (:func:`~shardcore.integrations.hf.causal_lm_loss.defer_logits_gather`), or kept split (``parallel_output``)."""
        from ..integrations.hf.causal_lm_loss import defer_logits_gather, loss_on_slices_where_causal_lm

        get_head = getattr(self.model, "get_output_embeddings", None)
        head = get_head() if callable(get_head) else None
        if self.shard_config.parallel_output:
            loss_on_slices_where_causal_lm(self.model, head)
        else:
            defer_logits_gather(self.model, head)
        return self.model
