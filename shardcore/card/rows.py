"""The card ``shardcore check`` prints: each rank's numbers (:mod:`.rank`) merged into rows, each
with its worst relative error, its tolerance (the kit's, :mod:`shardcore.testing.tolerance`) and
a pass or a fail naming the part, the parameter and the number."""

from __future__ import annotations

from typing import Any

import attrs

from ..testing.steps import step_bound
from ..testing.tolerance import GRAD, LOSS, LOSS_LATER, STEP
from .parts import PARTS

__all__ = ["Card", "Row", "card_from_ranks", "unheld"]


@attrs.frozen
class Row:
    """One comparison: ``what`` (``"gradients: attention"``), its worst relative error, the
    tolerance, whether it held, and ``where`` (the parameter or step of the worst error)."""

    what: str
    error: float
    tolerance: float
    passed: bool
    where: str = ""


@attrs.frozen
class Card:
    """What ``shardcore check`` found: the rows, the collectives per rank, what was reduced."""

    model: str
    layout: str
    world: int
    steps: int
    rows: tuple[Row, ...]
    collectives: dict[str, list[int]]
    torch_calls: dict[str, list[int]]
    reduced: dict[str, tuple[Any, Any]]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    @property
    def failures(self) -> list[Row]:
        return [r for r in self.rows if not r.passed]

    def to_json(self) -> dict[str, Any]:
        out = attrs.asdict(self, recurse=True)
        out["reduced"] = {k: list(v) for k, v in self.reduced.items()}
        out["passed"] = self.passed
        return out

    def format(self) -> str:
        lines = [
            f"shardcore check: {self.model} at {self.layout} ({self.world} ranks), {self.steps} AdamW steps, float32"
        ]
        if self.reduced:
            lines.append("reduced to run here: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in self.reduced.items()))
        else:
            lines.append("checked at its full size")
        lines.append(f"  {'what':<38} {'worst error':>12} {'tolerance':>10}  result  where")
        for r in self.rows:
            verdict = "pass" if r.passed else "FAIL"
            lines.append(f"  {r.what:<38} {r.error:12.3g} {r.tolerance:10.3g}  {verdict:<6}  {r.where}")
        for title, counts in (
            ("shardcore's collectives", self.collectives),
            ("torch.distributed calls", self.torch_calls),
        ):
            text = ", ".join(f"{k} {_span(v)}" for k, v in sorted(counts.items())) or "none"
            lines.append(f"{title} per rank, all steps: {text}")
        if self.passed:
            lines.append("PASS: the sharded model computes the unsharded model's numbers")
        else:
            lines.append(
                "FAIL: " + "; ".join(f"{r.what} {r.error:.3g} > {r.tolerance:g} at {r.where}" for r in self.failures)
            )
        return "\n".join(lines)


def _span(counts: list[int]) -> str:
    return str(counts[0]) if len(set(counts)) == 1 else f"{min(counts)}-{max(counts)}"


def _worst(errors: dict[str, float]) -> tuple[float, str]:
    name = max(errors, key=lambda n: errors[n])
    return errors[name], name


def _loss_rows(ranks: list[dict]) -> list[Row]:
    """The loss of each step: the mean over the ranks (each data-parallel part's loss, every part
    counted by as many ranks) against the unsharded model's."""
    rows = []
    for step in range(len(ranks[0]["losses"])):
        got = sum(r["losses"][step][0] for r in ranks) / len(ranks)
        want = ranks[0]["losses"][step][1]
        error = abs(got - want) / max(abs(want), 1e-12)
        tolerance = (LOSS if step == 0 else LOSS_LATER).rtol
        rows.append(Row(f"loss, step {step + 1}", error, tolerance, error <= tolerance, f"{got:.6g} vs {want:.6g}"))
    return rows


def unheld(groups: list[list[str]], held: list) -> list[str]:
    """The first name of each parameter (``groups``: each under all its names) that no rank's ``held`` names."""
    every = set().union(*held)
    return [group[0] for group in groups if not every & set(group)]


def _held_row(ranks: list[dict]) -> Row | None:
    """Every parameter of the unsharded model held by some rank (a tied weight under any of its names)."""
    missing = unheld(ranks[0]["all"], [r["held"] for r in ranks])
    if not missing:
        return None
    return Row("parameters held by some rank", float("inf"), 0.0, False, ", ".join(missing[:4]))


def _norm_rows(ranks: list[dict]) -> list[Row]:
    """The norm ``torch.nn.utils.clip_grad_norm_`` returned at each step (what the optimizer's step is
    scaled by), its worst step: against the gradients' own tolerance (:data:`GRAD`), as the norm of
    gradients each within it is (``|‖g‖ - ‖g_ref‖| <= ‖g - g_ref‖``); a norm not summed over some
    ranks is off by a large fraction."""
    errors = {
        f"step {s + 1}": max(
            abs(r["norms"][s][0] - r["norms"][s][1]) / max(abs(r["norms"][s][1]), 1e-12) for r in ranks
        )
        for s in range(len(ranks[0]["norms"]))
    }
    error, where = _worst(errors)
    return [Row("clip_grad_norm_'s norm", error, GRAD.rtol, error <= GRAD.rtol, where)]


def card_from_ranks(ranks: list[dict], *, model: str, layout: str, reduced: dict) -> Card:
    """Merge every rank's numbers (:func:`~.rank.rank_numbers`) into the card."""
    rows = _loss_rows(ranks)
    parts = ranks[0]["parts"]
    gradients: dict[str, float] = {}
    for r in ranks:
        for name, error in r["gradients"].items():
            gradients[name] = max(error, gradients.get(name, 0.0))
    for part in PARTS:
        mine = {n: e for n, e in gradients.items() if parts.get(n, "other") == part}
        if mine:
            error, where = _worst(mine)
            rows.append(Row(f"gradients: {part}", error, GRAD.rtol, error <= GRAD.rtol, where))
    held = _held_row(ranks)
    rows += [held] if held is not None else []
    rows += _norm_rows(ranks)
    update = ranks[0]["update"]
    params: dict[str, float] = {}
    for r in ranks:
        for name, diff in r["parameters"].items():
            params[name] = max(diff, params.get(name, 0.0))
    diff, where = _worst(params)
    steps = len(ranks[0]["losses"])
    rows.append(
        Row(f"parameters after {steps} steps", diff / max(update, 1e-30), STEP.rtol, diff <= step_bound(update), where)
    )
    kinds = lambda key: sorted({k for r in ranks for k in r[key]})  # noqa: E731
    return Card(
        model=model,
        layout=layout,
        world=len(ranks),
        steps=steps,
        rows=tuple(rows),
        collectives={k: [r["collectives"].get(k, 0) for r in ranks] for k in kinds("collectives")},
        torch_calls={k: [r["torch_calls"].get(k, 0) for r in ranks] for k in kinds("torch_calls")},
        reduced=reduced,
    )
