"""The pipeline schedules of ``torch.distributed.pipelining`` by name, and how blocks split into stages."""

from __future__ import annotations

#: Schedules with one stage per rank; the others (multi-stage) run ``stages_per_rank`` stages each.
_SINGLE = ("GPipe", "1F1B")
_DEFAULT_SCHEDULE = "1F1B"


def schedule_names() -> list[str]:
    """The schedules ``torch.distributed.pipelining`` offers in the installed torch."""
    from torch.distributed.pipelining import schedules

    candidates = [
        "GPipe",
        "1F1B",
        "Interleaved1F1B",
        "LoopedBFS",
        "InterleavedZeroBubble",
        "ZBVZeroBubble",
        "DualPipeV",
    ]
    out = []
    for name in candidates:
        try:
            schedules.get_schedule_class(name)
        except ValueError:
            continue
        out.append(name)
    return out


def _schedule_class(name: str):
    from torch.distributed.pipelining import schedules

    return schedules.get_schedule_class(name)


def _is_single(name: str) -> bool:
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    return issubclass(_schedule_class(name), PipelineScheduleSingle)


def split_layers(num_blocks: int, num_stages: int) -> list[int]:
    """An even split of ``num_blocks`` over ``num_stages`` (the first stages take one more)."""
    base, extra = divmod(num_blocks, num_stages)
    return [base + (1 if s < extra else 0) for s in range(num_stages)]
