"""``ShardConfig``'s checks across its fields, run when one is made (no collective)."""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["check_config"]


def check_config(config: Any, auto_chooses: tuple[str, ...], sharded_modes: tuple[str, ...]) -> None:
    """Raise ``ValueError`` naming the fields of ``config`` (a ``ShardConfig``) that contradict each other (``auto_chooses``:
    the fields ``auto`` leaves at their defaults; ``sharded_modes``: the ``data_parallel`` modes on FSDP2)."""
    if config.auto is not None:
        defaults = attrs.fields_dict(type(config))
        chosen = [k for k in auto_chooses if getattr(config, k) != defaults[k].default]
        if chosen:
            raise ValueError(
                f"ShardConfig(auto=...) chooses the layout, but {', '.join(f'{k}={getattr(config, k)!r}' for k in chosen)} "
                "was given too; leave those unset, or drop auto and set the layout yourself"
            )
    if config.data_parallel_shard_size is not None and config.data_parallel != "hsdp":
        raise ValueError(
            f"ShardConfig(data_parallel_shard_size={config.data_parallel_shard_size}) is HSDP's shard group, but "
            f"data_parallel={config.data_parallel!r}; set data_parallel='hsdp' or leave data_parallel_shard_size unset"
        )
    if config.mixed_precision is not None and config.data_parallel not in sharded_modes:
        raise ValueError(
            f"ShardConfig(mixed_precision={config.mixed_precision!r}) is FSDP2's mixed precision (weights and "
            f"gradient reduction in fp32, compute in {config.mixed_precision}), but data_parallel="
            f"{config.data_parallel!r}; use data_parallel='fsdp', 'zero2' or 'hsdp', or run the forward under "
            "torch.autocast (what DDP and tensor parallelism alone use)"
        )
    if not config.enable_sequence_parallelism and config.enable_sequence_overlap:
        raise ValueError(
            "ShardConfig(enable_sequence_overlap=True) overlaps sequence-parallel communication, but "
            "enable_sequence_parallelism=False; enable sequence parallelism or leave the overlap off"
        )
    if not config.enable_sequence_parallelism and config.sequence_parallelism_mode is not None:
        raise ValueError(
            f"ShardConfig(sequence_parallelism_mode={config.sequence_parallelism_mode!r}) without "
            "enable_sequence_parallelism=True; enable it or leave the mode unset"
        )
    if config.tensor_parallel_size is not None and config.tensor_parallel_process_group is not None:
        import torch.distributed as dist

        group_size = dist.get_world_size(config.tensor_parallel_process_group)
        if group_size != config.tensor_parallel_size:
            raise ValueError(
                f"ShardConfig: tensor_parallel_size={config.tensor_parallel_size} but "
                f"tensor_parallel_process_group has {group_size} ranks; pass one or make them agree."
            )
