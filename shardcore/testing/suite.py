"""A family's conformance tests as lists of cases: each test function of a plugin's test file is one
line naming its cases, the kit doing the building, the ranks and the checking.

A plugin's tests module declares its family (its own ``build(model, **kw)`` and ``batch(model, **kw)``,
both at module level of an importable module, as every rank calls them) and assigns the tests::

    FAMILY = Family(build, batch_for, vocab=VOCAB)
    test_matches_unsharded = FAMILY.matches(Case("causal-tp2", "MyForCausalLM"), Case("tp4", "MyForCausalLM", tp=4))
    test_refused_on_every_rank = FAMILY.refuses(Refusal("heads", {"num_attention_heads": 6}, "is not divisible"))

pytest collects each assigned name as a test parametrized by its cases' ids. The checks are the kit's
own (:func:`assert_sharded_matches`, :func:`assert_generate_matches`, :func:`assert_save_pretrained_matches`,
:func:`assert_explain_matches`, :func:`refusal_message`, :func:`assert_pipeline_matches`,
:func:`assert_generate_through_stages`); what a test of its own adds beyond them stays a plain test.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..distributed.launcher import run_on_ranks

__all__ = ["Case", "Family", "Refusal"]

#: greedy decoding, cached: the tokens and scores :func:`assert_generate_matches` compares
GENERATE = {"max_new_tokens": 8, "do_sample": False, "use_cache": True}


@dataclass(frozen=True)
class Case:
    """One comparison: the family's ``model`` (the class name its ``build`` and ``batch`` take) built with
    ``build`` keywords, fed ``batch(model, **batch)``, sharded by ``ShardConfig(tensor_parallel_size=tp,
    **config)``; a model class whose name ends in ``Model`` (no head) is compared on its last hidden state."""

    id: str
    model: str
    tp: int = 2
    build: Mapping[str, Any] = field(default_factory=dict)
    batch: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def world(self) -> int:
        """The ranks the case runs on: tensor x pipeline x sequence x data parallel sizes."""
        sizes = ("pipeline_parallel_size", "sequence_parallel_size", "data_parallel_size")
        return self.tp * math.prod(self.config.get(name) or 1 for name in sizes)

    def shard_config(self):
        from ..config import ShardConfig

        return ShardConfig(tensor_parallel_size=self.tp, **self.config)


@dataclass(frozen=True)
class Refusal:
    """Input the plugin must refuse on every rank, before any collective: the family's default model
    built with ``build`` keywords, at ``tp`` ranks; the refusal holds ``message``."""

    id: str
    build: Mapping[str, Any]
    message: str
    tp: int = 4


@dataclass(frozen=True)
class Family:
    """A model family's tests: ``build(model, **kw)`` a model with random weights, ``batch(model, **kw)`` its
    inputs (labels included for a model with a head); ``vocab`` its vocabulary size (generation through
    stages); ``max_param_fraction``: ``{tp: the largest share of the parameters one rank may hold}``."""

    build: Callable[..., Any]
    batch: Callable[..., dict]
    vocab: int | None = None
    pad_token_id: int = 0
    max_param_fraction: Mapping[int, float] = field(default_factory=lambda: {2: 0.6})

    def make(self, case: Case, **extra) -> Callable[[], Any]:
        return functools.partial(self.build, case.model, **{**case.build, **extra})

    def inputs(self, case: Case) -> dict:
        return self.batch(case.model, **case.batch)

    # ---- the tests, each parametrized by its cases
    def matches(self, *cases: Case):
        """Outputs, loss, every gradient and the parameters after AdamW steps equal the unsharded model's."""

        def check(case):
            for report in run_on_ranks(case.world, _matches, self, case):
                assert "max_abs_diff_after_steps" in report, report

        return _test(cases, check)

    def generates(self, *cases: Case):
        """Greedy ``generate()`` sharded equals unsharded, tokens and scores, on every rank."""
        return _test(cases, lambda case: _same(run_on_ranks(case.world, _generates, self, case)))

    def saves(self, *cases: Case):
        """HF's ``save_pretrained`` on every rank writes the checkpoint ``from_pretrained`` loads unsharded."""

        def check(case, tmp_path):
            reports = run_on_ranks(case.world, _saves, self, case, str(tmp_path / "ckpt"))
            assert all(r["tensors"] > 0 for r in reports), reports

        return _test(cases, check, tmp_path=True)

    def explains(self, case: Case, layer: str, forward: Mapping[str, int]):
        """``explain`` (meta device) predicts a real step; ``layer``'s forward issues ``forward`` collectives."""

        def check(case):
            report = run_on_ranks(case.world, _explains, self, case)[0]
            assert report["collectives_per_layer"][layer]["forward"] == dict(forward), report

        return _test((case,), check)

    def refuses(self, *refusals: Refusal):
        """Each bad input is refused on every rank with its message, before any collective."""

        def check(case):
            messages = run_on_ranks(case.tp, _refuses, self, case)
            assert all(case.message in m for m in messages), messages

        return _test(refusals, check)

    def pipelines(self, *cases: Case):
        """Pipeline stages on the model's own forward train like the unsharded model on the whole batch."""

        def check(case):
            for report in run_on_ranks(case.world, _pipelines, self, case):
                assert report["loss_rel_diff"] <= 1e-6 and "max_abs_diff_after_steps" in report, report

        return _test(cases, check)

    def generates_through_stages(self, case: Case):
        """Greedy ``generate()`` through ``case.config["pipeline_parallel_size"]`` stages (2 if not given), on
        as many ranks, equals the unsharded model's."""
        return _test((case,), lambda case: _same(run_on_ranks(_stages(case), _through_stages, self, case)))


def _test(cases, check: Callable, tmp_path: bool = False):
    """A pytest test function running ``check(case)`` for each case, its id the case's."""
    import pytest

    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        raise ValueError(f"two cases share an id in {ids}: give each its own")
    if tmp_path:

        def test(case, tmp_path):
            check(case, tmp_path)

    else:

        def test(case):
            check(case)

    return pytest.mark.parametrize("case", cases, ids=ids)(test)


def _same(tokens: list) -> None:
    assert all(t == tokens[0] for t in tokens), tokens


# ---- what every rank runs (module level: the ranks import it by name)
def _loss(case: Case) -> dict:
    from .conformance import hidden_state_loss

    return {"loss_fn": hidden_state_loss("last_hidden_state")} if case.model.endswith("Model") else {}


def _matches(family: Family, case: Case) -> dict:
    from .conformance import assert_sharded_matches

    fraction = family.max_param_fraction.get(case.tp)
    return assert_sharded_matches(
        family.make(case), family.inputs(case), case.shard_config(), max_param_fraction=fraction, **_loss(case)
    )


def _generates(family: Family, case: Case) -> list:
    import torch

    from .. import optimize
    from .generation import assert_generate_matches

    torch.manual_seed(0)
    ref = family.make(case)().eval()
    torch.manual_seed(0)
    model = optimize(family.make(case)(), case.shard_config()).eval()
    prompt = {k: v for k, v in family.inputs(case).items() if k != "labels"}
    return assert_generate_matches(ref, model, **prompt, **GENERATE, pad_token_id=family.pad_token_id).tolist()


def _saves(family: Family, case: Case, path: str) -> dict:
    from .saving import assert_save_pretrained_matches

    return assert_save_pretrained_matches(family.make(case), family.inputs(case), case.shard_config(), path)


def _explains(family: Family, case: Case) -> dict:
    from .explained import assert_explain_matches

    return assert_explain_matches(family.make(case), family.inputs(case), case.shard_config(), **_loss(case))


def _refuses(family: Family, refusal: Refusal) -> str:
    from ..config import ShardConfig
    from .refusals import refusal_message

    return refusal_message(
        functools.partial(family.build, **refusal.build), ShardConfig(tensor_parallel_size=refusal.tp)
    )


def _pipelines(family: Family, case: Case) -> dict:
    from .pipeline import assert_pipeline_matches

    return assert_pipeline_matches(family.make(case), family.inputs(case), case.shard_config())


def _through_stages(family: Family, case: Case) -> list:
    import torch

    from .generation import assert_generate_through_stages

    def make():  # the same weights at each call
        torch.manual_seed(0)
        return family.make(case)()

    if family.vocab is None:
        raise ValueError("generation through stages draws prompts from the vocabulary: give Family(vocab=...)")
    return assert_generate_through_stages(make, family.vocab, stages=_stages(case))


def _stages(case: Case) -> int:
    return case.config.get("pipeline_parallel_size", 2)
