"""Every tolerance the kit compares with, in one place, and the margin each comparison kept.

Why bounds relative to what is compared (fp32, unit roundoff ``u = 2**-24``, about 6e-8):

* Sharding changes the order of floating-point sums (a split matmul and its all-reduce, a loss
  combined over vocabulary slices), and so does another CPU: AVX-512, AVX2 and the default
  kernels block the same dot product differently and fuse multiply-adds or not. A sum of ``K``
  terms in another order differs by about ``sqrt(K) * u`` (at worst ``K * u``) times the size of
  its terms, and every layer of depth ``L`` adds its own: the kit's tiny models (``K`` up to ~1e3,
  ``L`` up to ~4) land near 1e-6 *of the magnitude of what is compared*. So an absolute 1e-5 holds
  for outputs of size 1 on one CPU and fails for logits a ``logit_scale`` multiplies by 14 on the
  next. Every bound here is ``atol + rtol * scale``: ``scale`` the size of the reference, ``atol`` a
  floor for a reference that is zero.
* **outputs** (:data:`OUTPUT`): ``max |got - want| <= 1e-6 + 1e-5 * max |want|``, per output tensor.
  Scaled by the tensor's largest element, not element by element: an element near zero that is the
  sum of large terms carries the rounding of the large terms.
* **losses** (:data:`LOSS`): relative 5e-6 of the unsharded loss. A loss reduces the outputs, so it
  carries their rounding, which scales with the logits, not with the loss: CLIP's contrastive loss
  (~2) over logits its ``logit_scale`` multiplies by 14 differs by 9.3e-7 of itself under the
  portable kernels, 0.93 of the 1e-6 this was, while a loss no term of which is wrong moves far more.
  A later step's (:data:`LOSS_LATER`): 1e-5, since both models have then moved by rounding through
  the optimizer.
* **gradients** (:data:`GRAD`): ``||g - g_ref|| <= 1e-4 * ||g_ref||`` per parameter, a relative norm
  (under an absolute floor a gradient of 1e-8 could be zeroed or sign-flipped and pass); a
  gradient under :data:`GRAD_FLOOR` (1e-5) of the largest norm is rounding noise and fails as
  untestable unless declared zero.
* **parameters after optimizer steps** (:data:`STEP`): relative to the update's own size,
  ``max |p - p_ref| <= 1e-7 + 1e-2 * max |p_ref - p_initial|``, the largest move of any element of
  the reference model. AdamW's ``m / (sqrt(v) + eps)`` turns a gradient's rounding ``d`` into a
  step that differs by up to ``lr * d / eps`` (the kit runs ``eps=1e-5``), at most a few 1e-3 of
  the update; a real error (a missed update, a doubled tied weight, a slice that does not move)
  is off by a large part of the update itself. A fixed 1e-5 was the update's size times the
  learning rate the tests happened to use.
* **kernels against the plain math** (:data:`EAGER`): a fused attention or a compiled module
  against the model's own modules rounds differently by construction: every bound times 10.

The margin: every comparison records ``worst / bound`` (a ratio; 1 fails). With ``SHARDCORE_MARGINS``
set to a file, each process appends its ratios there as JSON lines with the test that ran them
(``PYTEST_CURRENT_TEST``, which the rank launcher hands to its workers); ``nox -s margins`` reports
the comparisons that kept less than they should (``tests/margins.py``).
"""

from __future__ import annotations

import json
import os

import attrs

__all__ = [
    "EAGER",
    "GRAD",
    "GRAD_FLOOR",
    "LOSS",
    "LOSS_LATER",
    "NORM",
    "OUTPUT",
    "SCORES",
    "STEP",
    "Tolerance",
    "within",
]

#: where each process appends its margins (JSON lines); unset: nothing is recorded
MARGINS_ENV = "SHARDCORE_MARGINS"


@attrs.frozen
class Tolerance:
    """``atol + rtol * scale``: how far a value may be from the reference whose size is ``scale``."""

    rtol: float = attrs.field(validator=attrs.validators.ge(0.0))
    atol: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))

    def bound(self, scale: float) -> float:
        """The largest difference allowed against a reference of size ``scale``."""
        return self.atol + self.rtol * abs(scale)

    def times(self, factor: float) -> Tolerance:
        """This tolerance ``factor`` times looser (both terms)."""
        return Tolerance(rtol=self.rtol * factor, atol=self.atol * factor)


#: a model output, per tensor: scale = its largest element
OUTPUT = Tolerance(rtol=1e-5, atol=1e-6)
#: a loss of the first step, relative to the unsharded loss
LOSS = Tolerance(rtol=5e-6)
#: a loss after optimizer steps moved both models by rounding
LOSS_LATER = Tolerance(rtol=1e-5)
#: a gradient, relative norm against the unsharded gradient's norm
GRAD = Tolerance(rtol=1e-4)
#: a gradient smaller than this times the largest gradient norm is rounding noise
GRAD_FLOOR = 1e-5
#: a parameter after optimizer steps: scale = the largest element move of the reference's update
STEP = Tolerance(rtol=1e-2, atol=1e-7)
#: a gradient norm (clip_grad_norm_'s total), relative
NORM = Tolerance(rtol=1e-5)
#: generation scores (log-probabilities or logits), scale = the step's largest score magnitude, at least 1
SCORES = Tolerance(rtol=1e-4)
#: how much looser a kernel is allowed against the plain math than sharded against unsharded
EAGER = 10.0


def within(what: str, diff: float, bound: float, message: str) -> float:
    """Check one comparison: ``diff <= bound``, else ``AssertionError(message)``; records the
    margin (``diff / bound``) under ``what`` (the kind of comparison: ``"output"``, ``"step"``...)
    and returns ``diff``. ``message`` names what differs and by how much."""
    if not diff <= bound:  # NaN fails too
        raise AssertionError(message)
    _record(what, diff, bound)
    return diff


#: the worst ratio written so far, per (test, kind of comparison), in this process
_WORST: dict[tuple[str, str], float] = {}


def _record(what: str, diff: float, bound: float) -> None:
    """Append the margin to ``$SHARDCORE_MARGINS`` when it is this process's worst so far for the
    running test and this kind of comparison (a few lines per test, not one per parameter)."""
    path = os.environ.get(MARGINS_ENV)
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0] or "(outside pytest)"
    ratio = diff / bound if bound > 0 else (0.0 if diff == 0 else float("inf"))
    if ratio <= _WORST.get((test, what), -1.0):
        return
    _WORST[test, what] = ratio
    line = json.dumps({"test": test, "what": what, "ratio": ratio, "diff": diff, "bound": bound})
    with open(path, "a", encoding="utf-8") as f:  # one short line per write: appends do not interleave
        f.write(line + "\n")


def read_margins(path: str) -> dict[tuple[str, str], dict]:
    """The worst margin per (test, kind of comparison) in a ``$SHARDCORE_MARGINS`` file, over its
    processes (each rank appends its own)."""
    worst: dict[tuple[str, str], dict] = {}
    if not os.path.exists(path):
        return worst
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:  # a line cut by a killed process
                continue
            key = (row["test"], row["what"])
            if key not in worst or row["ratio"] > worst[key]["ratio"]:
                worst[key] = row
    return worst


def margin_report(worst: dict[tuple[str, str], dict], above: float = 0.3) -> list[str]:
    """Markdown table rows of the comparisons whose worst error exceeds ``above`` of its bound, the
    closest first; a header and the count of comparisons when none does."""
    close = sorted((r for r in worst.values() if r["ratio"] > above), key=lambda r: -r["ratio"])
    lines = [
        f"{len(worst)} (test, kind of comparison) pairs recorded; {len(close)} above {above:g} of their bound.",
        "",
    ]
    if close:
        lines += ["| worst / bound | comparison | worst | bound | test |", "| ---: | --- | ---: | ---: | --- |"]
        lines += [
            f"| {r['ratio']:.2f} | {r['what']} | {r['diff']:.3g} | {r['bound']:.3g} | `{r['test']}` |" for r in close
        ]
    return lines
