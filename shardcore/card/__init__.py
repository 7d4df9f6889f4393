"""``shardcore check``: will my layout compute the right numbers? The user's model and layout run on
local gloo processes beside the unsharded model, and a card says, part by part, how far apart they are.

::

    card = shardcore.check("path/to/config_dir", shardcore.ShardConfig(tensor_parallel_size=2))
    print(card.format())          # or: shardcore check path/to/config_dir --tp 2
    assert card.passed

Each rank builds the unsharded model and the sharded one alike (the same seed), then runs ``steps``
training steps on both as the user runs them: ``shardcore.pipeline_step`` on its data-parallel part
of the batch (a plain forward and backward without a pipeline), ``torch.nn.utils.clip_grad_norm_``,
AdamW. The card (:class:`~.rows.Card`) compares the loss of every step, every gradient after the
first backward grouped by part (embeddings, attention, MLP, experts and router, norms, a vision
tower or projector, the head), the clipped norm the optimizer sees, every parameter after the steps,
and lists the collectives that ran; each row with its worst relative error against the kit's
tolerance (:mod:`shardcore.testing.tolerance`), pass or fail, and where. A model too large for this
machine is checked reduced (:mod:`.source`); the card says what was reduced.

The layout's world runs for real (``tp x pp x sp x dp`` processes) up to :data:`MAX_WORLD` ranks; a larger
one is checked at each of its dimensions at 2 for real and built whole on the fake backend (:mod:`.large`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ..config import ShardConfig
from ..distributed.launcher import run_on_ranks
from ..testing.tolerance import GRAD_FLOOR
from .large import MAX_WORLD, build_world, merge_cards, say, scaled_layouts, world_rows
from .parts import PARTS, parts_of
from .rank import rank_numbers
from .rows import Card, Row, card_from_ranks
from .source import ModelSource, reduce_config

__all__ = ["MAX_WORLD", "PARTS", "Card", "LayoutRefused", "ModelSource", "Row", "check", "parts_of", "reduce_config"]


class LayoutRefused(ValueError):
    """``optimize`` refused the layout (on every rank alike, before any collective): the verdict is
    the refusal, its message naming what is wrong and the fix. A failure later, in a training step,
    is a :class:`~shardcore.testing.RankError` with every failing rank's traceback."""


def world_of(config: ShardConfig) -> int:
    """The ranks ``config``'s layout takes: data x pipeline x sequence x tensor parallel sizes."""
    dp, tp = config.data_parallel_size or 1, config.tensor_parallel_size or 1  # tp None: the ranks left, none here
    return dp * config.pipeline_parallel_size * config.sequence_parallel_size * tp


def layout_name(config: ShardConfig) -> str:
    parts = [
        f"dp{config.data_parallel_size} ({config.data_parallel})" if (config.data_parallel_size or 1) > 1 else "",
        f"pp{config.pipeline_parallel_size}" if config.pipeline_parallel_size > 1 else "",
        f"sp{config.sequence_parallel_size} ({config.sequence_parallelism_mode})"
        if config.sequence_parallel_size > 1
        else "",
        f"ep{config.expert_parallel_size}" if config.expert_parallel_size > 1 else "",
        f"tp{config.tensor_parallel_size or 1}",
    ]
    return " x ".join(p for p in parts if p)


def default_batch(config: Any, shard: ShardConfig) -> dict:
    """Token ids, a mask with one row left-padded and causal-LM labels: 2 rows per pipeline stage and
    data-parallel part (a multiple of the microbatch count), 16 tokens per sequence-parallel rank."""
    from ..testing import token_batch

    text = getattr(config, "text_config", None) or config
    vocab = getattr(text, "vocab_size", None)
    if not isinstance(vocab, int):
        raise ValueError("check: the model's config has no vocab_size, so no token batch can be made; give batch=")
    dp = shard.data_parallel_size or 1
    pp = shard.pipeline_parallel_size
    micro = shard.num_microbatches or pp * (shard.pipeline_stages_per_rank or 2) if pp > 1 else 1
    rows = math.lcm(max(2, 2 * pp), micro) * dp
    return token_batch(vocab, rows, 16 * shard.sequence_parallel_size)


def check(
    model: Any,
    config: ShardConfig,
    *,
    batch: Mapping[str, Any] | list | Callable[[], Any] | None = None,
    steps: int = 2,
    max_norm: float = 1.0,
    lr: float = 1e-3,
    seed: int = 0,
    reduce: bool | None = None,
    layers: int | None = None,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    progress: bool = False,
) -> Card:
    """Run ``config``'s layout of ``model`` against the unsharded model on local gloo processes
    and return the card (see the module). ``model``: a directory with a HuggingFace ``config.json``,
    ``"module:Class"``, or a module-level callable building it; ``batch``: the inputs (with labels),
    cut evenly over the data-parallel ranks, or a list of one batch per data-parallel rank (uneven
    parts: an image on one rank only), default a token batch; ``reduce``: check a smaller model keeping what the layout depends on
    (default: only a HuggingFace model above :data:`~.source.REDUCE_ABOVE` parameters), ``layers``
    its layer count; ``loss_fn``: for a model whose output has no loss (a plain ``nn.Module``), ``loss_fn(output,
    labels)``, the model called with the batch but its ``labels`` (a module-level function: every rank imports it;
    not with a pipeline, whose last stage computes the model's own loss); ``progress``: a line on stderr as each
    part starts (the command's)."""
    world = world_of(config)
    if loss_fn is not None and config.pipeline_parallel_size > 1:
        raise ValueError(
            f"check: loss_fn= with pipeline_parallel_size={config.pipeline_parallel_size}: a pipeline's last stage "
            "computes the model's own loss; give a model whose output has a loss, or check without a pipeline"
        )
    if steps < 1:
        raise ValueError(f"check: steps={steps}; at least 1 (the gradients are compared after the first)")
    source = ModelSource(model, reduce=reduce, layers=layers, pp=config.pipeline_parallel_size)
    if world > MAX_WORLD:
        return _check_large(source, config, world, batch=batch, steps=steps, max_norm=max_norm, lr=lr, seed=seed,
                            loss_fn=loss_fn, progress=progress)  # fmt: skip
    hf_config, _, reduced = source.plan()
    source = attrs.evolve(source, reduce=bool(reduced))  # decided once, here: every rank builds the same
    batch = _batch_of(batch, config, hf_config)
    say(progress, f"{layout_name(config)} on {world} local processes beside the unsharded model, {steps} steps")
    ranks = run_on_ranks(
        world, rank_numbers, source, config, batch, steps=steps,
        max_norm=max_norm, seed=seed, lr=lr, floor=GRAD_FLOOR, loss_fn=loss_fn,
    )  # fmt: skip
    refusals = {r["refused"] for r in ranks if "refused" in r}
    if refusals:
        raise LayoutRefused(f"shardcore.optimize refused the layout: {' / '.join(sorted(refusals))}")
    name = model if isinstance(model, str) else getattr(model, "__qualname__", type(model).__name__)
    return card_from_ranks(ranks, model=str(name), layout=layout_name(config), reduced=reduced)


def _check_large(source: ModelSource, config: ShardConfig, world: int, **kwargs) -> Card:
    """A world above :data:`MAX_WORLD` (:mod:`.large`): built whole on the fake backend, its numbers
    checked for real at every dimension at 2 (a list of per-rank batches cannot follow the smaller
    data-parallel size: refused)."""
    if callable(kwargs["batch"]):
        kwargs["batch"] = kwargs["batch"]()
    if isinstance(kwargs["batch"], list | tuple):
        raise ValueError(
            f"check: the layout takes {world} ranks, more than the {MAX_WORLD} this machine runs, so its numbers are "
            "checked at each dimension at 2: give one batch (cut evenly), not one per data-parallel rank"
        )
    hf_config, _, reduced = source.plan()
    source = attrs.evolve(source, reduce=bool(reduced))
    say(kwargs["progress"], f"{layout_name(config)}: its {world} ranks built on the fake backend, rank after rank")
    built = build_world(source, _with_stage_shapes(config, kwargs.get("batch"), hf_config), world, kwargs["progress"])
    refused = sorted({b["refused"] for b in built["ranks"] if "refused" in b})
    if refused:
        raise LayoutRefused(f"shardcore.optimize refused the layout at {world} ranks: {' / '.join(refused)}")
    cards = [
        check(source.spec, small, reduce=source.reduce, layers=source.layers, **kwargs)
        for small in scaled_layouts(config)
    ]
    return merge_cards(cards, world_rows(built, world), layout=layout_name(config), world=world)


def _with_stage_shapes(config: ShardConfig, batch: Any, hf_config: Any) -> ShardConfig:
    """``config`` with a pipeline's ``example_inputs`` (a simulated stage cannot receive its shapes): a
    data-parallel rank's part of ``batch`` (callable: called; ``None``: the default token batch)."""
    if config.pipeline_parallel_size == 1 or config.example_inputs is not None:
        return config
    from ..testing import dp_part

    batch = _batch_of(batch, config, hf_config)
    return attrs.evolve(config, example_inputs=dp_part(batch, 0, config.data_parallel_size or 1))


def _batch_of(batch: Any, config: ShardConfig, hf_config: Any) -> dict | list[dict]:
    """The check's inputs: ``batch`` (callable: called), a list of one per data-parallel rank checked against
    the layout's data-parallel size, or (``None``) the default token batch of ``hf_config``."""
    if callable(batch):
        batch = batch()
    if isinstance(batch, list | tuple):
        if len(batch) != (config.data_parallel_size or 1):
            raise ValueError(
                f"check: {len(batch)} batches given, one per data-parallel rank, but data_parallel_size is "
                f"{config.data_parallel_size or 1}; give one batch (cut evenly) or one per data-parallel rank"
            )
        return [dict(b) for b in batch]
    if batch is None:
        if hf_config is None:
            raise ValueError("check: a model given as a callable needs batch= (its inputs, with labels)")
        batch = default_batch(hf_config, config)
    return dict(batch)
