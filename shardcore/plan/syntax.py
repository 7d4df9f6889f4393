"""A sharding plan's syntax: read, checked, resolved against nothing yet (no model, no collective)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .registry import find_style, style_names

AXES = ("dp", "tp")
#: The spec of a replicated parameter that acts on split activations (a norm over each head's
#: features): its gradient is summed over the group. transformers' name for it.
GRAD_SUM = "replicated_with_grad_allreduce"
#: transformers' tensor-parallel styles (``base_model_tp_plan``) and any a plugin registers are given to a
#: module or a parameter in place of a spec: one registry (:mod:`shardcore.plan.registry`); shardcore's own
#: with transformers' meaning (:mod:`shardcore.plan.styles`).
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


def load_plan(plan: str | Path | Mapping[str, Any]) -> _Plan:
    """Read and check the syntax of a plan (a YAML path or a mapping); no model needed yet."""
    if isinstance(plan, Mapping):
        data, lines, source = dict(plan), {}, "plan"
    else:
        data, lines, source = _read_yaml(Path(plan))
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
        if isinstance(spec, str) and find_style(spec) is not None:
            specs[key] = spec
            continue
        _check_spec(at, key, spec)
        if spec is not None and "dp" in spec:
            dp[key] = list(spec).index("dp")
        specs[key] = None if spec is None else [None if a == "dp" else a for a in spec]
    return _Plan(specs, lines, source, dp)


def _read_yaml(path: Path) -> tuple[Any, dict[str, int], str]:
    """The plan file's data, the line of each top-level key, and its name for messages."""
    try:
        import yaml
    except ImportError as err:
        raise PlanError("YAML plans need PyYAML: pip install 'shardcore[yaml]' (or pass the plan as a dict)") from err
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
    return ({} if data is None else data), lines, source


def _check_spec(at: str, key: str, spec: Any) -> None:
    """A spec is null or a list of mesh axis names and nulls, each axis at most once."""
    if spec is not None and not (isinstance(spec, list | tuple) and all(a is None or isinstance(a, str) for a in spec)):
        raise PlanError(
            f"{at}: {key!r}: a spec is a list of mesh axis names or null, or a plan style "
            f"({', '.join(style_names())}), got {spec!r}"
        )
    for axis in spec or ():
        if axis is not None and axis not in AXES:
            raise PlanError(
                f"{at}: {key!r}: unknown mesh axis {axis!r}; shardcore's axes are {', '.join(AXES)} "
                "(or null for a replicated dimension)"
            )
    for axis in AXES:
        if spec is not None and sum(a == axis for a in spec) > 1:
            raise PlanError(f"{at}: {key!r}: {list(spec)} splits more than one dimension over {axis}")


def _regex(key: str) -> re.Pattern:
    return re.compile("^" + re.escape(key).replace(r"\*", r"\d+") + "$")
