"""``shardcore check MODEL --tp T [--pp P --sp S --dp D --ep E ...]``: the card of :func:`shardcore.check`
printed (``--json`` for CI); exit status 0 when every row passes, 1 when one fails, 2 on bad input."""

from __future__ import annotations

import json
import sys

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    c = sub.add_parser(
        "check",
        help="run a layout on local processes against the unsharded model: a card of the loss, every gradient "
        "by part, the clipped norm, the parameters after the steps",
        description="Build MODEL, shard it with the layout given on tp x pp x sp x dp local gloo processes beside the "
        "unsharded model, train both a few steps as a user does, and print each comparison's worst relative error "
        "against its tolerance, pass or fail. A model too large for this machine is checked reduced (the card says how); "
        "a layout above 8 ranks is built whole on the fake backend and its numbers checked at 2 per dimension.",
    )
    c.add_argument("model", help="a directory with a HuggingFace config.json, or module:Class")
    c.add_argument("--tp", type=int, default=1, help="tensor_parallel_size")
    c.add_argument("--pp", type=int, default=1, help="pipeline_parallel_size")
    c.add_argument("--schedule", default=None, help="pipeline_schedule (default: the config's, 1F1B)")
    c.add_argument("--sp", type=int, default=1, help="sequence_parallel_size")
    c.add_argument(
        "--sp-mode",
        default=None,
        choices=("split_gather", "all_to_all", "ring_attn", "all_gather_kv"),
        help="sequence_parallelism_mode (default with --sp > 1: all_to_all)",
    )
    c.add_argument("--dp", type=int, default=1, help="data_parallel_size (with --data-parallel)")
    c.add_argument("--data-parallel", default=None, choices=("fsdp", "zero2", "hsdp", "ddp"), help="data_parallel")
    c.add_argument("--ep", type=int, default=1, help="expert_parallel_size (over --dp data-parallel ranks)")
    c.add_argument("--steps", type=int, default=2, help="AdamW steps (the gradients are compared after the first)")
    size = c.add_mutually_exclusive_group()
    size.add_argument("--reduce", action="store_true", default=None, help="check a reduced model even if it is small")
    size.add_argument("--full", dest="reduce", action="store_false", help="check the model at its full size")
    c.add_argument("--layers", type=int, default=None, help="the reduced model's layers (default: as few as needed)")
    c.add_argument("--json", action="store_true", help="print the card as JSON")


def _config(args):
    from ..config import ShardConfig

    settings = {"tensor_parallel_size": args.tp, "pipeline_parallel_size": args.pp, "expert_parallel_size": args.ep}
    if args.schedule:
        settings["pipeline_schedule"] = args.schedule
    if args.sp > 1 or args.sp_mode:
        mode = args.sp_mode or "all_to_all"
        settings |= {"sequence_parallel_size": args.sp, "enable_sequence_parallelism": True}
        settings["sequence_parallelism_mode"] = mode
    if args.dp > 1 or args.data_parallel:
        if not args.data_parallel:
            raise ValueError(f"--dp {args.dp} needs --data-parallel (fsdp, zero2, hsdp or ddp)")
        settings |= {"data_parallel": args.data_parallel, "data_parallel_size": args.dp}
    return ShardConfig(**settings)


def run(args) -> int:
    from ..distributed.launcher import RankError
    from . import check

    try:
        config = _config(args)
        card = check(args.model, config, steps=args.steps, reduce=args.reduce, layers=args.layers, progress=True)
    except (ValueError, TypeError, NotImplementedError, FileNotFoundError, LookupError) as err:
        print(f"shardcore check: {err}", file=sys.stderr)  # bad input, or the layout refused by name
        return 2
    except RankError as err:  # the sharded model failed in a training step: the tracebacks say where
        print(f"shardcore check: FAIL: the layout's training step failed: {err}", file=sys.stderr)
        return 1
    print(json.dumps(card.to_json(), indent=2, default=str) if args.json else card.format())
    return 0 if card.passed else 1
