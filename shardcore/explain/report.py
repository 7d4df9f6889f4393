"""``shardcore explain``'s report as text and as JSON."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _fmt_counts(counts: dict[str, int] | list[str]) -> str:
    if isinstance(counts, list):
        counts = Counter(counts)
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "-"


def format_report(report: dict[str, Any]) -> str:
    """The report as the table ``shardcore explain`` prints."""
    lay = report["layout"]
    lines = [
        f"{report['model']} ({report['policy']}), tp={lay['tp']} pp={lay['pp']} sp={lay['sp']}"
        + (f" ep={lay['ep']}" if lay.get("ep", 1) > 1 else ""),
        f"parameters: {_fmt_bytes(report['bytes_unsharded'])} unsharded, {_fmt_bytes(report['bytes_per_rank'])} "
        f"per tensor-parallel rank ({report['fraction_per_rank']:.4f} of the model)",
    ]
    if report["pipeline_stage_bytes"]:
        per = ", ".join(_fmt_bytes(b) for b in report["pipeline_stage_bytes"])
        lines.append(f"pipeline stages (per rank): {per}; largest rank {_fmt_bytes(report['largest_rank_bytes'])}")
    lines.append("")
    header = ("module pattern", "n", "replacement", "bytes/rank", "fwd", "bwd")
    table = [
        (
            r["pattern"] or "<root>",
            str(r["count"]),
            r["module"] + ("" if r["parallel"] else " (replicated)"),
            _fmt_bytes(r["bytes_per_rank"]),
            _fmt_counts(r["collectives"]["forward"]),
            _fmt_counts(r["collectives"]["backward"]),
        )
        for r in report["modules"]
    ]
    widths = [max(len(x[i]) for x in [header, *table]) for i in range(len(header))]
    for line in [header, *table]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    lines.append("")
    for cls, counts in report["collectives_per_layer"].items():
        lines.append(
            f"collectives per {cls}: forward {_fmt_counts(counts['forward'])}; backward {_fmt_counts(counts['backward'])}"
        )
    out = report["collectives_outside_layers"]
    lines.append(
        f"collectives outside the layers: forward {_fmt_counts(out['forward'])}; backward {_fmt_counts(out['backward'])}"
    )
    step = report["collectives_per_step"]
    lines.append(
        f"collectives per training step: forward {_fmt_counts(step['forward'])}; backward {_fmt_counts(step['backward'])}"
    )
    att = report["attention"]
    lines.append(
        f"attention: {att['model'] or 'the model library default'} as built; with enable_flash_attention: "
        f"{att['enable_flash_attention']}"
    )
    lines += _sequence_and_experts(report)
    lines.append(f"valid tensor_parallel_size (up to 64): {report['valid_tensor_parallel_sizes']}")
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)


def _sequence_and_experts(report: dict[str, Any]) -> list[str]:
    lines = []
    traffic = report.get("collective_bytes_per_step")
    if traffic:
        fwd, bwd = (
            ", ".join(f"{_fmt_bytes(n)} {k}" for k, n in traffic[p].items()) or "-" for p in ("forward", "backward")
        )
        lines.append(f"collective bytes per training step (this rank): forward {fwd}; backward {bwd}")
    seq = report.get("sequence")
    if seq:
        sent = seq["bytes_sent_per_layer"]
        lines.append(
            f"attention keys/values per rank ({seq['mode']}, {seq['seq']} tokens x {seq['batch']}): kept for the "
            f"backward {_fmt_bytes(seq['kv_bytes_kept_per_layer'])} per layer; in flight "
            f"{_fmt_bytes(seq['kv_bytes_in_flight'])} (one layer at a time); sent per layer forward "
            f"{_fmt_bytes(sent['forward'])}, backward {_fmt_bytes(sent['backward'])}"
        )
    experts = report.get("experts")
    if experts:
        line = f"experts: {_fmt_bytes(experts['expert_bytes_per_rank'])} per rank over {experts['layers']} layers"
        sent = experts.get("all_to_all_bytes_per_layer")
        if sent:
            line += f"; all-to-all sent per layer forward {_fmt_bytes(sent['forward'])}, backward {_fmt_bytes(sent['backward'])}"
        lines += [line, f"note: {experts['note']}"]
    return lines


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2)
