"""``shardcore check`` of a layout larger than one machine runs (more than :data:`MAX_WORLD` ranks).

Its numbers are checked for real at a smaller world: each of its dimensions above 1 (tensor, pipeline,
sequence, data parallel) at its smallest prime factor (2 for even sizes), all of them together where that
fits :data:`MAX_WORLD` processes, else the largest groups of dimensions that fit (four dimensions at 2: one
run per dimension left out, so that every two still run together) (:func:`scaled_layouts`).
What only the whole world decides (the divisibility of heads, key/value heads, experts, layers and
vocabulary by its sizes, each stage's layers, what each rank holds) is checked by building it: one
process plays rank after rank of the whole world on the fake process-group backend
(:mod:`shardcore.distributed.simulate`) and runs ``optimize`` as that rank, on ranks that take every
coordinate of every dimension (:func:`sampled_ranks`); the card gets a row for that build, one for
every parameter held by some built rank, and says which real world its numbers come from.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import math
import multiprocessing
import sys
from typing import Any

import attrs

from ..config import ShardConfig
from .parts import name_groups
from .rows import Card, Row, unheld
from .source import ModelSource

__all__ = ["MAX_WORLD", "build_world", "merge_cards", "sampled_ranks", "say", "scaled_layouts", "world_rows"]

#: the most processes the check starts on one machine
MAX_WORLD = 8

_DIMS = ("tensor_parallel_size", "pipeline_parallel_size", "sequence_parallel_size", "data_parallel_size")


def say(on: bool, text: str) -> None:
    """One progress line on stderr (``shardcore check``'s, as each part starts)."""
    if on:
        print(f"shardcore check: {text}", file=sys.stderr, flush=True)


def scaled_layouts(config: ShardConfig) -> list[ShardConfig]:
    """The layouts run for real in place of ``config``'s: every dimension above 1 at its smallest prime factor
    (2 for even sizes; expert parallelism the largest divisor of its size the data-parallel one allows; a
    pipeline's explicit split and microbatch count back to their defaults where its size changes; mixed
    precision off where data parallelism is), together where that fits :data:`MAX_WORLD` ranks, else the
    largest groups of dimensions that fit, every dimension in one at least."""
    active = [d for d in _DIMS if (getattr(config, d) or 1) > 1]
    small = {d: _smallest_factor(getattr(config, d) or 1) for d in _DIMS}
    fits = lambda group: math.prod(small[d] for d in group) <= MAX_WORLD  # noqa: E731
    groups = next(
        g
        for r in range(len(active), 0, -1)
        if (g := [c for c in itertools.combinations(active, r) if fits(c)]) and set().union(*g) == set(active)
    )
    return [_scaled(config, {d: (small[d] if d in group else 1) for d in _DIMS}) for group in groups]


def _smallest_factor(n: int) -> int:
    return next(f for f in range(2, n + 1) if n % f == 0) if n > 1 else 1


def _scaled(config: ShardConfig, sizes: dict[str, int]) -> ShardConfig:
    dp = sizes["data_parallel_size"]
    changes: dict[str, Any] = dict(sizes)
    changes["expert_parallel_size"] = math.gcd(config.expert_parallel_size, dp)
    if config.data_parallel == "hsdp":
        changes["data_parallel_shard_size"] = None if dp == 1 else dp  # one shard group: no replication to check
    if dp == 1:
        changes |= {"data_parallel": None, "data_parallel_size": None, "mixed_precision": None}
    if sizes["pipeline_parallel_size"] != config.pipeline_parallel_size:
        changes |= {"pipeline_layers": None, "num_microbatches": None}
    if sizes["sequence_parallel_size"] == 1 and (config.sequence_parallel_size or 1) > 1:
        changes |= {"enable_sequence_parallelism": False, "sequence_parallelism_mode": None}
    return attrs.evolve(config, **changes)


def sampled_ranks(config: ShardConfig, world: int) -> list[int]:
    """Ranks of ``config``'s world that, together, take every coordinate of every dimension (each
    dimension's coordinates with the others at 0), and the last rank."""
    from ..distributed.layout import ParallelLayout

    layout = ParallelLayout.from_config(config, world_size=world)
    seen: set[int] = {0, world - 1}
    for dim in ("tp", "pp", "sp", "dp"):
        wanted = set(range(getattr(layout, dim)))
        for rank in range(world):
            coordinates = layout.coordinates(rank)
            others = all(v == 0 for k, v in coordinates.items() if k != dim and k in ("tp", "pp", "sp", "dp"))
            if others and coordinates[dim] in wanted:
                wanted.discard(coordinates[dim])
                seen.add(rank)
    return sorted(seen)


def _build_ranks(source: ModelSource, config: ShardConfig, world: int, ranks: list[int], progress: bool) -> dict:
    """In a process of its own: each of ``ranks`` of ``world`` on the fake backend, ``optimize`` as that
    rank; ``{"names": every parameter under all its names, "ranks": what each built rank holds}``."""
    import warnings

    import torch
    import torch.distributed as dist

    from ..cost.auto import optimize
    from ..data_parallel import dp_local
    from ..distributed.simulate import init_simulated_world

    out = []
    for k, rank in enumerate(ranks):
        say(progress, f"building rank {rank} of {world} ({k + 1} of the {len(ranks)} built)")
        init_simulated_world(rank, world)
        try:
            torch.manual_seed(0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the simulated rank's data checks are off: said on the card
                model = optimize(source.build(), config)
            held = {n: dp_local(p).numel() for n, p in model.named_parameters()}
            out.append({"rank": rank, "coordinates": model.shardcore.layout.coordinates(rank), "held": held})
        except (ValueError, TypeError, NotImplementedError, LookupError) as err:
            out.append({"rank": rank, "refused": f"{type(err).__name__}: {err}"})
        finally:
            dist.destroy_process_group()
    return {"names": name_groups(source.build()), "ranks": out}


def build_world(source: ModelSource, config: ShardConfig, world: int, progress: bool = False) -> dict:
    """:func:`_build_ranks` of the :func:`sampled_ranks` in a fresh process (this one keeps its groups)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_build_ranks, source, config, world, sampled_ranks(config, world), progress).result()


def world_rows(build: dict, world: int) -> list[Row]:
    """The card's rows of the whole world's build (:func:`build_world`): ``optimize`` accepted it on every
    built rank; every parameter of the model (under any of its names) held by some built rank."""
    built, names = build["ranks"], build["names"]
    rows = [Row(f"build at {world} ranks", 0.0, 0.0, True, f"{len(built)} of {world} ranks built on the fake backend")]
    missing = unheld(names, [b["held"] for b in built])
    if missing:
        rows.append(Row(f"parameters held at {world} ranks", float("inf"), 0.0, False, ", ".join(missing[:4])))
    else:
        sizes = [sum(b["held"].values()) for b in built]
        rows.append(Row(f"parameters held at {world} ranks", 0.0, 0.0, True, f"{min(sizes)}-{max(sizes)} per rank"))
    return rows


def merge_cards(cards: list[Card], rows: list[Row], *, layout: str, world: int) -> Card:
    """One card of the real runs ``cards`` (each row named by its run where there are several) and the
    whole world's ``rows`` first."""
    merged = list(rows)
    collectives: dict[str, list[int]] = {}
    calls: dict[str, list[int]] = {}
    for card in cards:
        tag = f"[{card.layout}] " if len(cards) > 1 else ""
        merged += [attrs.evolve(r, what=tag + r.what) for r in card.rows]
        collectives |= {tag + k: v for k, v in card.collectives.items()}
        calls |= {tag + k: v for k, v in card.torch_calls.items()}
    real = " and ".join(c.layout for c in cards)
    return Card(
        model=cards[0].model,
        layout=f"{layout}, its numbers checked at {real}",
        world=world,
        steps=cards[0].steps,
        rows=tuple(merged),
        collectives=collectives,
        torch_calls=calls,
        reduced=cards[0].reduced,
    )
