"""Composite models: a model made of parts that other policies cover, each part sharded by its own.

A vision-language or encoder-decoder model is often built from models that plugins already
cover (Llava: a CLIP vision tower and a Llama; BLIP-2: a vision encoder, a Q-Former and an OPT or
T5). Its policy names the parts and what is its own, and copies nothing::

    class LlavaPolicy(CompositePolicy):
        def parts(self):
            return ["model.vision_tower", "model.language_model"]   # found in the registry by class

        def glue_policy(self):                                     # the modules outside every part
            return {type(self.model): ModulePolicyDescription(sub_module_replacement=[vocab_head(...)])}

Each part's policy is the one :func:`shardcore.resolve_policy` finds for the part's class: an
installed plugin's, or the tensor-parallel plan its own (sub-)config ships. ``part_policy(path)``
overrides that choice. Every part's policy then runs on its sub-module as it would on a model of
its own (its checks, its descriptions matched only inside the part, its pre- and postprocessing),
so a description keyed by a class never reaches into another part. What the rest of shardcore
asks of a policy (its blocks, and every spec of :mod:`shardcore.spec`: norms, parameters whose
gradient is summed, checkpoint names...) is the parts' answers under their paths, merged with the
composite's own (:meth:`CompositePolicy.glue_specs`) by each spec's one ``merge`` rule. Pipeline and
sequence parallelism are the composite's own only: refused by name unless a subclass declares them.
"""

from __future__ import annotations

from torch import nn

from .policy import ModulePolicyDescription, Policy
from .spec import SPECS, ChecksSpec, under

__all__ = ["CompositePolicy"]


class CompositePolicy(Policy):
    """A policy that shards each part of a model with the policy covering that part (module docstring)."""

    def parts(self) -> list[str]:
        """Dotted paths (from ``self.model``) of the sub-modules sharded by their own policy. Parts
        must not nest. Structural: read the model instance."""
        raise NotImplementedError(f"{type(self).__name__} must implement parts()")

    def part_policy(self, path: str) -> Policy | type[Policy] | None:
        """The policy for the part at ``path``; ``None`` (the default): the one the registry finds
        for its class (a plugin's, or the plan its config ships)."""
        return None

    def glue_policy(self) -> dict[type | str, ModulePolicyDescription]:
        """Descriptions for the modules outside every part (a head over the language model's
        output, a projector), matched only there. Default: none (they stay replicated)."""
        return {}

    def glue_blocks(self) -> list[tuple[str, nn.Module]]:
        """Repeated blocks outside every part (each must hold a parallel module once sharded). Default: none."""
        return []

    # -- the parts' policies, made once ------------------------------------------------------------

    def part_policies(self) -> dict[str, Policy]:
        """``{path: policy}`` for every part, each set to this policy's config, degrees and layout."""
        from .sharder import resolve_policy

        made = self.__dict__.get("_made")
        if made is None or made[0] is not self.model:  # resolved for this model once
            paths = self.parts()
            for a in paths:
                for b in paths:
                    if a != b and b.startswith(f"{a}."):
                        raise ValueError(f"{type(self).__name__}.parts(): '{b}' lies inside '{a}'; parts must not nest")
            made = (self.model, {p: resolve_policy(self.model.get_submodule(p), self.part_policy(p)) for p in paths})
            self.__dict__["_made"] = made
        policies = made[1]
        if hasattr(self, "shard_config"):  # set by optimize before anything asks a part more than its class
            for policy in policies.values():
                policy.set_shard_config(self.shard_config, self.tp_size)
                policy.layout = self.layout
        return policies

    # -- what the sharder and the rest of shardcore ask ---------------------------------------------

    def module_policy(self):
        return self.glue_policy()

    def config_sanity_check(self) -> None:
        """Every part's checks, each error named with its part (a subclass with glue to check calls this too)."""
        for path, policy in self.part_policies().items():
            try:
                policy.config_sanity_check()
            except (ValueError, NotImplementedError) as err:
                raise type(err)(f"{type(self.model).__name__}.{path} ({type(policy).__name__}): {err}") from err

    def preprocess(self) -> nn.Module:
        for path, policy in self.part_policies().items():
            self._put(path, policy.preprocess())
        return self.model

    def postprocess(self) -> nn.Module:
        for path, policy in self.part_policies().items():
            self._put(path, policy.postprocess())
        return self.model

    def _put(self, path: str, module: nn.Module) -> None:
        """A part's pre/postprocessing may return another module for its model: set it in place."""
        if module is not self.model.get_submodule(path):
            parent, _, name = path.rpartition(".")
            setattr(self.model.get_submodule(parent) if parent else self.model, name, module)
            policy = self.part_policies()[path]
            policy.set_model(module)

    def blocks(self):
        out = list(self.glue_blocks())
        for path, policy in self.part_policies().items():
            out += [(under(path, name), block) for name, block in policy.blocks()]
        return out

    # -- every spec from the parts, by the spec's own merge rule (shardcore.spec) -------------------------

    def glue_specs(self) -> dict[str, object]:
        """The composite's own declarations, ``{policy method: spec}`` (``"pipeline"``, ``"sequence"``, ...):
        what its own forward supports and its glue needs, merged with the parts' by each spec's ``merge``
        (a kind not given: ``None``, which each ``merge`` reads as nothing declared). Default: none (a
        pipeline and sequence parallelism are refused: the parts' cannot be joined)."""
        return {}

    def _merged(self, method: str, own=None):
        parts = {path: getattr(policy, method)() for path, policy in self.part_policies().items()}
        return SPECS[method].merge(own if own is not None else self.glue_specs().get(method), parts)

    def tensor_parallel(self):
        return self._merged("tensor_parallel")

    def pipeline(self):
        return self._merged("pipeline")

    def sequence(self):
        return self._merged("sequence")

    def experts(self):
        return self._merged("experts")

    def data_parallel(self):
        return self._merged("data_parallel")

    def kernels(self):
        return self._merged("kernels")

    def checkpoints(self):
        return self._merged("checkpoints")

    def checks(self):
        # the glue's own blocks are checked unless the composite says otherwise
        return self._merged("checks", self.glue_specs().get("checks") or ChecksSpec(blocks=self.glue_blocks()))
