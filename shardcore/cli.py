"""``shardcore`` command line: ``shardcore plugins [--json]``."""

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
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
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
            print(f"\n{r['name']}: {r['error']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shardcore", description="shardcore command line")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plugins", help="list installed plugins and the model classes they cover")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.command == "plugins":
        return _plugins(args.json)
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
