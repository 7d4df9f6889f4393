"""``ShardConfig``: what to shard and how, validated before any collective runs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs
from attrs import validators as v

__all__ = ["AutoLayout", "ShardConfig"]

#: ``ShardConfig.data_parallel``'s values that run on FSDP2's ``fully_shard`` (parameters split over ``dp``)
SHARDED_MODES = ("fsdp", "zero2", "hsdp")
#: Every sequence_parallelism_mode (built or not: see shardcore.sequence).
SEQUENCE_MODES = ("split_gather", "all_to_all", "ring_attn", "all_gather_kv")
#: the modes that run over the mesh's sp dim, through the attention registry
OVER_SP_MODES = ("all_to_all", "ring_attn", "all_gather_kv")


def _sequence_mode(instance: ShardConfig, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and value not in SEQUENCE_MODES:
        raise ValueError(
            f"ShardConfig.sequence_parallelism_mode={value!r} is not a mode; choose one of {', '.join(SEQUENCE_MODES)}"
        )


@attrs.frozen(kw_only=True)
class AutoLayout:
    """The workload :class:`ShardConfig` ``auto=`` chooses a layout for (see :mod:`shardcore.cost.auto`).

    Args:
        seq: tokens per sequence. ``None``: the model config's ``max_position_embeddings``.
        batch: sequences per optimizer step over the whole job (the global batch; each
            data-parallel rank feeds its part). ``None``: one per rank.
        memory_gb: GiB a rank may hold; layouts needing more are never chosen. ``None``: the
            profile's ``memory_bytes_per_rank`` (what ``shardcore calibrate`` found free).
        optimizer: the optimizer state the memory and step time count: ``"adamw"``, ``"sgd"``
            (with momentum) or ``"none"`` (inference).
        profile: the machine profile's path (``shardcore calibrate --out``); ``None``: this
            machine's cached one. Never measured inside a job: calibrate first.
    """

    seq: int | None = attrs.field(default=None, validator=v.optional([v.instance_of(int), v.ge(1)]))
    batch: int | None = attrs.field(default=None, validator=v.optional([v.instance_of(int), v.ge(1)]))
    memory_gb: float | None = attrs.field(default=None, validator=v.optional([v.instance_of((int, float)), v.gt(0)]))
    optimizer: str = attrs.field(default="adamw", validator=v.in_(("adamw", "sgd", "none")))
    profile: str | os.PathLike | None = None


def _auto(value: Any) -> AutoLayout | None:
    if value is True:
        return AutoLayout()
    if value is False or value is None or isinstance(value, AutoLayout):
        return value or None
    raise TypeError(f"ShardConfig.auto={value!r}: pass True or a shardcore.AutoLayout(seq=..., batch=...)")


#: what ``auto`` chooses: left at their defaults when it is on
_AUTO_CHOOSES = (
    "tensor_parallel_size",
    "data_parallel_size",
    "pipeline_parallel_size",
    "sequence_parallel_size",
    "expert_parallel_size",
    "data_parallel",
    "num_microbatches",
    "pipeline_schedule",
    "pipeline_layers",
    "enable_sequence_parallelism",
    "sequence_parallelism_mode",
    "tensor_parallel_process_group",
    "plan",
    "device_mesh",
)


@attrs.frozen(kw_only=True)
class ShardConfig:
    """How a model is sharded.

    Field names and meanings follow ColossalAI's Shardformer so that configs carry over.

    The parallel degrees ``data_parallel_size x pipeline_parallel_size x sequence_parallel_size x
    tensor_parallel_size`` must equal the world size (see :class:`shardcore.ParallelLayout`); that
    is checked first, in :func:`shardcore.optimize`, before anything else and before any collective.

    Args:
        tensor_parallel_size: ranks a tensor-parallel group spans. ``None`` (default) means every
            rank the other degrees leave.
        data_parallel_size: data-parallel replicas; ``None`` (default): the ranks left over.
        pipeline_parallel_size, num_microbatches, pipeline_schedule: pipeline parallelism on
            ``torch.distributed.pipelining`` (see :mod:`shardcore.pipeline`): stages, microbatches
            per step (default: the number of stages) and the schedule (``"1F1B"`` by default; any
            schedule the installed torch offers). Train with :func:`shardcore.pipeline_step`.
        pipeline_layers: blocks per stage (default: an even split, the first stages taking one
            more); must sum to the model's blocks.
        pipeline_stages_per_rank: stages each rank runs under a multi-stage schedule
            (``Interleaved1F1B``, ``LoopedBFS``, ``InterleavedZeroBubble``: default 2;
            ``ZBVZeroBubble``, ``DualPipeV``: 2); one-stage schedules refuse another value.
        sequence_parallel_size: the Ulysses / context-parallel group (``sequence_parallelism_mode=
            "all_to_all"``, ``"ring_attn"`` or ``"all_gather_kv"``): the mesh's ``sp`` dim (``1``
            otherwise).
        data_parallel: what runs on the data-parallel dim (``dp`` of the mesh, see
            :mod:`shardcore.data_parallel`): ``"fsdp"`` (FSDP2's ``fully_shard`` on each
            block of :meth:`~shardcore.Policy.blocks` and on the model: parameters, gradients and
            optimizer state split over the data-parallel ranks too) or ``"ddp"`` (whole
            tensor-parallel slices on each replica, gradients all-reduced). ``None`` (default):
            nothing; the ``dp`` replicas are the caller's to synchronize. Each data-parallel rank
            feeds its own part of the global batch; gradients are averaged over them. ``"zero2"``:
            FSDP2 with the parameters kept gathered from forward to backward (ZeRO-2: gradients and
            optimizer state split, no re-gather in the backward). ``"hsdp"``: FSDP2 on a 2-D mesh,
            parameters split over ``data_parallel_shard_size`` ranks (one node) and replicated over
            the others. With ``pipeline_parallel_size > 1`` each stage is wrapped and its gradients
            reduced once per step, after the last microbatch.
        data_parallel_shard_size: under ``data_parallel="hsdp"``, the ranks each parameter is split
            over (a divisor of the data-parallel degree; consecutive data-parallel ranks).
        mixed_precision: ``"bf16"`` or ``"fp16"``: FSDP2's ``MixedPrecisionPolicy`` (under ``"fsdp"``,
            ``"zero2"``, ``"hsdp"``): forward and backward computed in that dtype, the weights and
            optimizer state kept in fp32, gradients reduced in fp32. ``None`` (default): the
            parameters' dtype. Without FSDP use ``torch.autocast``.
        expert_parallel_size: the experts of each mixture-of-experts layer split over this many
            data-parallel ranks (carved from ``dp``, see :mod:`shardcore.expert_parallel`): tokens
            travel to their experts' ranks and back by all-to-all, the dense weights stay
            data-parallel (``data_parallel="ddp"`` or ``"fsdp"`` required). ``1``: none.
        global_batch_balance: the router's load-balancing loss from the routing statistics of the
            whole global batch (summed over the data-parallel ranks) instead of each rank's part.
        plan: a sharding plan (torchprime's syntax), a YAML path or a dict: shards by it instead of
            a plugin's policy (see :mod:`shardcore.plan`); refused together with ``policy=``.
            ``"derive"``: a plan derived from the model's modules (attention by heads, MLP pairs
            column then row), checked by ``verify`` (see :mod:`shardcore.plan.derive`).
        example_inputs: what the checks at ``optimize`` run the model on: a tensor, a tuple (args), a
            dict (kwargs), a pair ``(tuple, dict)`` or a callable returning one; ``None``: found from the
            model (:mod:`shardcore.inputs`), and where none is, ``optimize`` says why.
        tensor_parallel_process_group: an existing process group to use instead of building one;
            its size then is the tensor-parallel size.
        device_mesh: a ``DeviceMesh`` the caller built (Lightning's, accelerate's, torchtitan's) to run
            on instead of building one (see :mod:`shardcore.distributed.given_mesh`): its dims read by
            name (``tp``/``tensor_parallel``, ``dp``/``data_parallel`` or ``dp_replicate`` x ``dp_shard``,
            ``pp``, ``cp``/``sp``), the degrees from its sizes (sizes set here must agree), its groups
            used. ``device_mesh_dims``: more names, ``{"mesh dim": "tp"}``.
        enable_tensor_parallelism: ``False`` leaves the model unsharded (policies still run their
            pre/post-processing), which is what TP=1 does too.
        parallel_output: ``False`` (default) returns full-vocabulary logits exactly like the
            unsharded model. ``True`` keeps logits split over the vocabulary on each rank; a
            model's loss is then computed with the vocab-parallel cross entropy, so no rank ever
            holds full logits.
        make_vocab_size_divisible_by: vocabularies are padded to a multiple of this times the
            TP size so every rank holds an equal slice; padding never shows in outputs.
        check_inputs: ``True`` (default): the sharded model's first forward, and each forward
            whose inputs' names, shapes or dtypes differ from the previous one's, first compares
            a checksum of its tensor inputs across the tensor-parallel group (one all-gather of
            two int64 per rank, one device-to-host read) and raises on every rank, naming the
            input, when they differ; forwards with unchanged shapes (a training loop's steady
            state) cost nothing. ``"always"``: every forward is checked. ``False``: none.
        verify: check the sharded model against the unsharded one (see :mod:`shardcore.verify`):
            at ``optimize`` one block of each kind and the model's output on a small random input,
            and at the first backward every replicated parameter's gradient across the
            tensor-parallel group (a checksum, one small collective); a difference raises
            :class:`~shardcore.ShardingCheckError` naming what differs. ``None`` (default): on for
            plans shardcore did not write (zero-config, ``plan=``), off for plugins' policies;
            ``True``: on for every policy; ``False``: off. Steady-state steps are not touched.
        collective_timeout: seconds one of shardcore's collectives may wait for the other ranks
            before raising an error that names it (layer, forward/backward, sequence number); on
            NCCL the host never waits on it: a watch reports the named cause at the bound and
            the process group's watchdog ends the process at the group's timeout.
            ``None``: ``$SHARDCORE_COLLECTIVE_TIMEOUT``, else 300. Per process; twice it is the
            timeout of every process group shardcore creates on NCCL (from torchrun's
            environment, and the layout's groups), so the watchdog ends a hang then.
        enable_flash_attention: attention on ``flash_attn`` 2 when it is installed and the model
            runs on CUDA in fp16/bf16, else on ``torch.nn.functional.scaled_dot_product_attention``
            (fused CPU/CUDA kernels; grouped K/V not repeated where the kernel allows), through
            the model library's own attention registry. Which one runs is logged at INFO.
        enable_fused_normalization: RMSNorm/LayerNorm on fused kernels (``torch.nn.functional.
            rms_norm``; apex on CUDA when installed), same parameters, same numbers within fp32.
        enable_jit_fused: the policy's projection + elementwise modules (SwiGLU, bias + GeLU,
            bias + dropout + residual) compiled with ``torch.compile``; eager, with one WARNING,
            where compilation is unavailable.
        enable_all_optimization: the three above (not sequence parallelism: it changes the layout).
        inference_only: drop what only training needs: no backward all-reduce hooks, no per-rank
            random streams; parameters are frozen and the model is put in eval mode (training
            it raises).
        enable_sequence_parallelism, sequence_parallelism_mode: sequence parallelism (see
            :mod:`shardcore.sequence`). ``"split_gather"`` (the default mode): Megatron-LM's, over
            the tensor-parallel group (norms, residuals and dropout on each rank's slice of the
            sequence; all-gather / reduce-scatter instead of the all-reduces). ``"all_to_all"``
            (DeepSpeed-Ulysses) over ``sequence_parallel_size`` ranks, alone or with TP.
            ``"ring_attn"``: context parallelism over them (zigzag-balanced queries, a bidirectional
            model's in contiguous parts; key/value
            blocks passed around the ring, merged by log-sum-exp: a rank holds two blocks, never the
            whole sequence's). ``"all_gather_kv"``: the same split, but each attention all-gathers
            every rank's keys and values and runs the model's own attention over them (one
            collective instead of ``sp - 1`` ring steps; the whole sequence's keys and values on
            every rank). A policy that supports ``"ring_attn"`` supports it.
        auto: ``True`` or an :class:`AutoLayout`: :func:`shardcore.optimize` chooses the degrees
            (``dp x pp x sp x tp``, ``ep``), the sequence mode, DDP/FSDP and the microbatches
            for this job's world size by the cost model over this machine's profile (``shardcore
            calibrate``), as ``shardcore explain --auto`` would print them: the predicted fastest
            layout that fits the memory cap, computed on rank 0 and sent to every rank, logged
            once, recorded as ``model.shardcore.auto``. The fields it chooses must be left unset.
        enable_sequence_overlap: overlap ``split_gather``'s communication with the matmuls
            (row-parallel matmuls in chunks, each reduce-scattered as it ends; gathers started
            early in the backward). Without sequence parallelism: ``ValueError``; with another
            mode: ``NotImplementedError``.
    """

    tensor_parallel_size: int | None = attrs.field(default=None, validator=v.optional([v.instance_of(int), v.ge(1)]))
    tensor_parallel_process_group: Any = None
    device_mesh: Any = attrs.field(default=None, eq=False)
    device_mesh_dims: Mapping[str, str] | None = attrs.field(
        default=None, validator=v.optional(v.deep_mapping(v.instance_of(str), v.instance_of(str)))
    )
    enable_tensor_parallelism: bool = attrs.field(default=True, validator=v.instance_of(bool))
    parallel_output: bool = attrs.field(default=False, validator=v.instance_of(bool))
    make_vocab_size_divisible_by: int = attrs.field(default=64, validator=[v.instance_of(int), v.ge(1)])
    check_inputs: bool | str = attrs.field(default=True, validator=v.in_((True, False, "always")))
    verify: bool | None = attrs.field(default=None, validator=v.optional(v.instance_of(bool)))
    collective_timeout: float | None = attrs.field(
        default=None, validator=v.optional([v.instance_of((int, float)), v.gt(0)])
    )

    enable_fused_normalization: bool = attrs.field(default=False, validator=v.instance_of(bool))
    enable_flash_attention: bool = attrs.field(default=False, validator=v.instance_of(bool))
    enable_jit_fused: bool = attrs.field(default=False, validator=v.instance_of(bool))
    enable_sequence_parallelism: bool = attrs.field(default=False, validator=v.instance_of(bool))
    sequence_parallelism_mode: str | None = attrs.field(default=None, validator=_sequence_mode)
    enable_sequence_overlap: bool = attrs.field(default=False, validator=v.instance_of(bool))
    enable_all_optimization: bool = attrs.field(default=False, validator=v.instance_of(bool))
    inference_only: bool = attrs.field(default=False, validator=v.instance_of(bool))

    data_parallel_size: int | None = attrs.field(default=None, validator=v.optional([v.instance_of(int), v.ge(1)]))
    pipeline_parallel_size: int = attrs.field(default=1, validator=[v.instance_of(int), v.ge(1)])
    num_microbatches: int | None = attrs.field(default=None, validator=v.optional([v.instance_of(int), v.ge(1)]))
    pipeline_schedule: str | None = attrs.field(default=None, validator=v.optional(v.instance_of(str)))
    pipeline_layers: tuple[int, ...] | None = attrs.field(
        default=None,
        converter=lambda x: None if x is None else tuple(x),
        validator=v.optional(v.deep_iterable(v.instance_of(int), v.instance_of(tuple))),
    )
    pipeline_stages_per_rank: int | None = attrs.field(
        default=None, validator=v.optional([v.instance_of(int), v.ge(1)])
    )
    sequence_parallel_size: int = attrs.field(default=1, validator=[v.instance_of(int), v.ge(1)])
    data_parallel: str | None = attrs.field(default=None, validator=v.optional(v.in_(("ddp", *SHARDED_MODES))))
    data_parallel_shard_size: int | None = attrs.field(
        default=None, validator=v.optional([v.instance_of(int), v.ge(1)])
    )
    mixed_precision: str | None = attrs.field(default=None, validator=v.optional(v.in_(("bf16", "fp16"))))
    expert_parallel_size: int = attrs.field(default=1, validator=[v.instance_of(int), v.ge(1)])
    global_batch_balance: bool = attrs.field(default=False, validator=v.instance_of(bool))
    plan: Any = attrs.field(default=None, validator=v.optional(v.instance_of((str, os.PathLike, Mapping))))
    example_inputs: Any = attrs.field(default=None, eq=False)
    auto: AutoLayout | None = attrs.field(default=None, converter=_auto)

    def __attrs_post_init__(self) -> None:
        from .config_checks import check_config

        check_config(self, _AUTO_CHOOSES, SHARDED_MODES)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> ShardConfig:
        """Build a config from ``SHARDCORE_TP`` (tensor-parallel size) in the environment."""
        import os

        env = os.environ if environ is None else environ
        kwargs: dict[str, Any] = {}
        if env.get("SHARDCORE_TP"):
            try:
                kwargs["tensor_parallel_size"] = int(env["SHARDCORE_TP"])
            except ValueError:
                raise ValueError(f"SHARDCORE_TP={env['SHARDCORE_TP']!r} is not an integer") from None
        kwargs.update(overrides)
        return cls(**kwargs)
