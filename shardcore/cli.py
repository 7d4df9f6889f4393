"""``shardcore`` command line: ``shardcore plugins [--features] [--json]``, ``shardcore explain MODEL --tp N``,
``shardcore plan MODEL [--out FILE]``, ``shardcore calibrate [--world N ...] [--out FILE] [--force]``."""

from __future__ import annotations

import argparse
import json
import sys

from .plugins import get_registry


def _plugins(as_json: bool) -> int:
    registry = get_registry()
    rows = [
        {
            "name": p.name,
            "distribution": p.distribution,
            "version": p.version,
            "models": sorted(p.models),
            "error": p.error,
        }
        for p in registry.plugins.values()
    ]
    failed = 1 if any(r["error"] for r in rows) else 0  # a plugin that cannot load is an error, not a note
    if as_json:
        print(json.dumps(rows, indent=2))
        return failed
    if not rows:
        print("No shardcore plugins installed (pip install shard-llama, shard-bert, ...).")
        return 0
    header = ("plugin", "distribution", "version", "status", "model classes")
    table = [
        (
            r["name"],
            r["distribution"] or "-",
            r["version"] or "-",
            "ok" if r["error"] is None else "FAILED",
            ", ".join(m.rsplit(".", 1)[-1] for m in r["models"]) or "-",
        )
        for r in rows
    ]
    widths = [max(len(str(x[i])) for x in [header, *table]) for i in range(len(header) - 1)]
    for line in [header, *table]:
        print("  ".join(str(c).ljust(w) for c, w in zip(line[:-1], widths, strict=True)) + "  " + line[-1])
    for r in rows:
        if r["error"]:
            print(f"\n{r['name']}: {r['error']}", file=sys.stderr)
    return failed


def _features(as_json: bool) -> int:
    """What each installed family declares (:mod:`shardcore.explain.features`), one model class a plugin."""
    from .explain.features import FEATURES, family_features

    rows = family_features(get_registry())
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    names = list(FEATURES)
    notes: dict[str, int] = {}

    def mark(why: str | None) -> str:
        if why is None:
            return "yes"
        notes.setdefault(why, len(notes) + 1)
        return f"no [{notes[why]}]"

    table = [("plugin", "model", *names)]
    for r in rows:
        cells = [mark(r["features"].get(f)) for f in names] if r["features"] else [mark(r["error"])] * len(names)
        table.append((r["plugin"], r["model"], *cells))
    widths = [max(len(str(x[i])) for x in table) for i in range(len(table[0]))]
    for line in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    print("\nyes: optimize's checks accept the layout (nox -s matrix measures it against the unsharded model)")
    for why, n in notes.items():
        print(f"[{n}] {why}")
    return 0


def _explain(args) -> int:
    import torch

    from .explain import ExplainError, explain, format_report, to_json

    dtype = getattr(torch, args.dtype) if args.dtype else None
    if dtype is not None and not isinstance(dtype, torch.dtype):
        print(
            f"shardcore explain: --dtype {args.dtype!r} is not a torch dtype (float32, bfloat16, ...)", file=sys.stderr
        )
        return 2
    if args.auto:
        return _auto(args, dtype)
    try:
        from .config import ShardConfig

        settings = {"plan": args.plan} if args.plan else {}
        if args.sp_mode:
            settings |= {"enable_sequence_parallelism": True, "sequence_parallelism_mode": args.sp_mode}
        config = ShardConfig(**settings) if settings else None
        report = explain(
            args.model,
            args.tp,
            pp=args.pp,
            sp=args.sp,
            ep=args.ep,
            dtype=dtype,
            device=args.device,
            config=config,
            seq=args.seq,
            batch=args.batch,
        )
    except ExplainError as err:
        if args.json:
            print(json.dumps({"error": str(err), "valid_tensor_parallel_sizes": err.valid_tp}, indent=2))
        print(f"shardcore explain: {err}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, NotImplementedError, FileNotFoundError, LookupError) as err:
        # the same messages optimize raises (layout, no plugin, bad model spec): no traceback
        print(f"shardcore explain: {err}", file=sys.stderr)
        return 1
    print(to_json(report) if args.json else format_report(report))
    return 0


def _auto(args, dtype) -> int:
    from .cost import load_profile, search
    from .cost.report import format_search
    from .explain import load_for_explain

    if args.world is None or args.seq is None:
        print(
            "shardcore explain --auto: give the ranks and the workload: --world N --seq L [--batch B]", file=sys.stderr
        )
        return 2
    try:
        model = load_for_explain(args.model, dtype)
        profile = load_profile(args.profile, group_sizes=tuple(sorted({2, min(args.world, 4)} - {1})) or (2,))
        memory = args.memory * 2**30 if args.memory is not None else None
        kw = dict(seq=args.seq, batch=args.batch, memory=memory, optimizer=args.optimizer)
        result = search(model, args.world, profile, **kw)
    except (ValueError, TypeError, NotImplementedError, FileNotFoundError, LookupError) as err:
        print(f"shardcore explain --auto: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2, default=str) if args.json else format_search(result, args.top))
    return 0 if result["best"] is not None else 1


def _plan(args) -> int:
    from .explain import load_for_explain
    from .plan import PlanError, hf_tp_plan

    try:
        model = load_for_explain(args.model)
        specs = hf_tp_plan(model)
    except (ValueError, TypeError, FileNotFoundError, LookupError, PlanError) as err:
        print(f"shardcore plan: {err}", file=sys.stderr)
        return 1
    if specs is None:
        print(
            f"shardcore plan: {type(model).__name__} ships no tensor-parallel plan (config.base_model_tp_plan)",
            file=sys.stderr,
        )
        return 1
    lines = [
        f"# {type(model).__name__}: derived from its config.base_model_tp_plan (shardcore's zero-config fallback).",
        "# Edit and pass back: ShardConfig(plan='this.yaml').",
    ]
    width = max(len(k) for k in specs) + 1

    def spec(v) -> str:
        return v if isinstance(v, str) else "[" + ", ".join("null" if a is None else a for a in v) + "]"

    lines += [f"{k + ':':<{width}} {spec(v)}" for k, v in specs.items()]
    text = "\n".join(lines) + "\n"
    if args.out:
        from pathlib import Path

        Path(args.out).write_text(text)
        print(f"written: {args.out}")
    else:
        print(text, end="")
    return 0


def _calibrate(args) -> int:
    from .cost import load_profile

    try:
        profile = load_profile(args.out, force=args.force, group_sizes=tuple(args.world), replace=True)
    except ValueError as err:
        print(f"shardcore calibrate: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(profile, indent=2))
        return 0
    print(
        f"profile: {profile['path']} ({profile['device_name']}, {profile['backend']}, measured in {profile['seconds']:.1f} s)"
    )
    for dtype, flops in profile["matmul_flops"].items():
        print(f"  matmul {dtype:<9} {flops / 1e9:10.1f} GFLOP/s")
    print(f"  memory per rank {profile['memory_bytes_per_rank'] / 2**30:.1f} GiB")
    for kind, by_size in profile["collectives"].items():
        for size, fit in by_size.items():
            group, _, world = size.partition("@")
            where = f"{group} ranks" + (f" (each group of {group} among {world})" if world else "")
            print(
                f"  {kind:<15} {where}: latency {fit['latency_s'] * 1e6:8.1f} us, "
                f"{fit['bytes_per_s'] / 1e9:7.3f} GB/s (bytes per rank)"
            )
    return 0


def _explain_parser(sub) -> None:
    e = sub.add_parser(
        "explain",
        help="show how a model would be sharded (on the meta device: no weights, no processes)",
        description="Build MODEL on the meta device and print, per module pattern, its parallel replacement, "
        "the bytes each rank holds, the collectives per layer, the attention backend and any divisibility problem.",
    )
    e.add_argument(
        "model", help="a directory with a HuggingFace config.json, or module:Class (e.g. transformers:LlamaForCausalLM)"
    )
    e.add_argument("--tp", type=int, default=None, help="tensor_parallel_size (required unless --auto)")
    e.add_argument("--pp", type=int, default=1, help="pipeline_parallel_size (planned: stage bytes)")
    e.add_argument("--sp", type=int, default=1, help="sequence_parallel_size (its mode: --sp-mode)")
    e.add_argument(
        "--ep",
        type=int,
        default=1,
        help="expert_parallel_size (as many data-parallel ranks; mixture-of-experts models)",
    )
    e.add_argument(
        "--sp-mode",
        default=None,
        choices=("split_gather", "all_to_all", "ring_attn", "all_gather_kv"),
        help="sequence_parallelism_mode (default with --sp > 1: all_to_all)",
    )
    e.add_argument("--seq", type=int, default=None, help="tokens per sequence: attention keys/values held and sent")
    e.add_argument("--batch", type=int, default=1, help="sequences per batch (with --seq)")
    e.add_argument("--dtype", default=None, help="parameter dtype (default: the config's dtype, else float32)")
    e.add_argument("--device", default="cpu", help="device the model would run on (picks the attention backend)")
    e.add_argument("--plan", default=None, help="a YAML sharding plan to explain instead of the plugin's policy")
    e.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = e.add_argument_group("--auto: choose the layout (the cost model over this machine's calibrate profile)")
    a.add_argument("--auto", action="store_true", help="rank every layout of --world ranks by predicted step time")
    a.add_argument("--world", type=int, default=None, help="ranks to lay out (with --auto)")
    a.add_argument("--memory", type=float, default=None, help="GiB a rank may hold (default: the profile's)")
    a.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd", "none"), help="its state and step")
    a.add_argument("--top", type=int, default=5, help="layouts to print")
    a.add_argument("--profile", default=None, help="a calibrate profile (default: this machine's, measured if absent)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shardcore", description="shardcore command line")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plugins", help="list installed plugins and the model classes they cover")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--features",
        action="store_true",
        help="what each installed family supports (tp, sequence modes, pp, fsdp, kernels, lazy init), from its policy",
    )
    _explain_parser(sub)
    from .card import command as check_command

    check_command.add_parser(sub)
    pl = sub.add_parser("plan", help="write the sharding plan a HuggingFace model ships, as a YAML plan to edit")
    pl.add_argument("model", help="a directory with a HuggingFace config.json, or module:Class")
    pl.add_argument("--out", default=None, help="write the YAML here instead of printing it")
    c = sub.add_parser(
        "calibrate",
        help="measure this machine once (matmul FLOP/s, collective latency and bandwidth, memory): a cached JSON profile",
    )
    c.add_argument("--world", type=int, nargs="+", default=[2], help="group sizes to measure collectives on")
    c.add_argument("--out", default=None, help="the profile's path (default: the cache, by machine)")
    c.add_argument("--force", action="store_true", help="measure again even if a profile is cached")
    c.add_argument("--json", action="store_true", help="print the profile as JSON")
    args = parser.parse_args(argv)
    if args.command == "check":
        return check_command.run(args)
    if args.command == "calibrate":
        return _calibrate(args)
    if args.command == "plan":
        return _plan(args)
    if args.command == "plugins":
        return _features(args.json) if args.features else _plugins(args.json)
    if args.command == "explain":
        if args.tp is None and not args.auto:
            parser.error("explain needs --tp (or --auto --world N --seq L to choose the layout)")
        for flag in ("tp", "pp", "sp"):
            if not args.auto and getattr(args, flag) < 1:
                parser.error(f"--{flag} must be at least 1")
        return _explain(args)
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
