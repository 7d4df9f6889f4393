"""``shardcore explain --auto``'s answer as text."""

from __future__ import annotations

from typing import Any


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def format_search(result: dict[str, Any], top: int = 5) -> str:
    """The chosen layout, the next ``top - 1`` with why each lost, those over the cap and the refused."""
    lines = [
        f"{result['model']}: {result['world']} ranks, global batch {result['batch']} x {result['seq']} tokens, "
        f"{result['optimizer']}, memory cap {_gib(result['memory_cap_bytes'])} per rank "
        f"(profile: {result['profile']})",
    ]
    best = result["best"]
    if best is None:
        lines.append("no layout fits the memory cap; the least memory: " + _least(result))
    else:
        cfg = ", ".join(f"{k}={v!r}" for k, v in best["config"].items())
        lines.append(f"chosen: {best['name']}  ->  shardcore.ShardConfig({cfg})")
    header = ("layout", "step s", "compute", "bubble", "optimizer", "communication", "memory/rank", "why not first")
    rows = []
    for row in [r for r in result["ranked"] if r["fits"]][:top]:
        comm = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in row["communication_s"].items() if v > 0) or "-"
        rows.append(
            (
                row["name"],
                f"{row['step_s']:.3f}",
                f"{row['compute_s']:.3f}",
                f"{row['bubble_s']:.3f}",
                f"{row['optimizer_s']:.3f}",
                comm,
                _gib(row["memory_bytes"]["total"]),
                row["why"],
            )
        )
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
    for line in [header, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    over = [r for r in result["ranked"] if not r["fits"]]
    if over:
        lines.append(f"over the memory cap ({len(over)}): " + "; ".join(f"{r['name']}: {r['why']}" for r in over[:top]))
    for r in result["refused"][:top]:
        lines.append(f"refused: {r['name']}: {r['refused']}")
    if len(result["refused"]) > top:
        lines.append(f"... and {len(result['refused']) - top} more refused (--json lists them all)")
    if not result.get("elementwise_priced", True):
        lines.append(
            "compute priced by FLOPs alone: "
            + (
                "its elementwise work was not traced (no forward on token ids ran on the meta device)"
                if result.get("elementwise") is None
                else "the profile has no elementwise rate (`shardcore calibrate --force` measures it)"
            )
        )
    lines.append(
        f"predicted from {result['candidates']} candidate layouts in {result['seconds']:.1f} s; step times are the "
        "cost model's (docs/explain.md: what it counts and how far it was from measured steps)"
    )
    return "\n".join(lines)


def _least(result: dict[str, Any]) -> str:
    if not result["ranked"]:
        return "none (every layout was refused)"
    least = min(result["ranked"], key=lambda r: r["memory_bytes"]["total"])
    return f"{least['name']} at {_gib(least['memory_bytes']['total'])}"
