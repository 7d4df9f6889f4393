"""``shardcore.hf.Trainer``: HuggingFace's ``Trainer`` for a sharded model (one changed import).

What the plain ``transformers.Trainer`` does that cannot be right for a sharded model, and what
this subclass does instead (everything else is the Trainer's own: loss logging, gradient
accumulation, the learning-rate schedule, callbacks, evaluation loss):

* **data**: accelerate shards batches over every process; here over the mesh's ``dp`` dim only,
  so the tensor- and sequence-parallel ranks of one replica receive the same batches (the
  dataloader is prepared with ``num_processes = dp`` and this rank's ``dp`` coordinate);
* **evaluation and prediction** gather losses and predictions over the ``dp`` dim only (over
  every process each would come back once per tensor-parallel rank); ``get_tp_size()`` is the
  number of ranks sharing a batch (the Trainer divides its world-wide label-token counts and the
  loss scale by it), and the count of input tokens seen counts each replica once;
* **the model**: accelerate would wrap it in ``DistributedDataParallel`` over the whole world
  (summing different slices); here it is left as ``optimize`` made it — data parallelism is
  ``ShardConfig(data_parallel="ddp" | "fsdp")`` on the ``dp`` dim, which is required when ``dp > 1``;
* **clipping** goes through ``torch.nn.utils.clip_grad_norm_``, which is right for a sharded
  model (:mod:`shardcore.grad_norm`);
* **checkpoints**: the weights via ``model.save_pretrained`` on every rank (a complete, unsharded
  HF checkpoint), each rank's optimizer state in a file of its own
  (``optimizer.rank{r}-of-{world}.pt``), and ``resume_from_checkpoint`` loads the weights with
  :func:`shardcore.load_checkpoint` (each rank its slices) and each rank's optimizer state. A
  checkpoint is recorded complete last (``shardcore_complete.json``, once every rank's files are
  written); ``resume_from_checkpoint=True`` resumes from the newest complete one, passing over
  (and naming) one a crash interrupted, and a path to an incomplete one is refused by name.

Pipeline stages are refused by name: the Trainer's step is one forward and backward of the whole
model, which a pipelined model does not have (use :func:`shardcore.pipeline_step`).
"""

from __future__ import annotations

import os
import pathlib
import warnings

import torch
import torch.distributed as dist
import transformers
from transformers.trainer import SCHEDULER_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ...checkpoint import CheckpointError, atomic
from ...distributed.objects import barrier

__all__ = ["Trainer"]


def _newest_complete(output_dir: pathlib.Path) -> str:
    """The newest checkpoint in ``output_dir`` whose record is there and true; the interrupted ones
    newer than it are named in a warning."""
    prefix = PREFIX_CHECKPOINT_DIR + "-"
    found = [d for d in output_dir.glob(prefix + "*") if d.is_dir() and d.name[len(prefix) :].isdigit()]
    skipped = []
    for directory in sorted(found, key=lambda d: int(d.name[len(prefix) :]), reverse=True):
        try:
            atomic.check_recorded(directory, "shardcore.hf.Trainer checkpoint")
        except CheckpointError as err:
            skipped.append(str(err))
            continue
        if skipped:
            warnings.warn("resuming from " + str(directory) + ", passing over: " + "; ".join(skipped), stacklevel=3)
        return str(directory)
    raise ValueError(
        f"No complete checkpoint in {output_dir} to resume from" + (f": {'; '.join(skipped)}" if skipped else "")
    )


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _check_model(model) -> None:
    """Refuse what this Trainer cannot train, by name, before any collective."""
    info = getattr(model, "shardcore", None)
    if info is None:
        raise TypeError(
            f"shardcore.hf.Trainer trains a model sharded by shardcore.optimize; {type(model).__name__} is not: "
            "call model = shardcore.optimize(model, ShardConfig(...)) first, or use transformers.Trainer"
        )
    if info.pipeline is not None:
        raise NotImplementedError(
            "shardcore.hf.Trainer: a model with pipeline stages (pipeline_parallel_size > 1) is not supported: the "
            "Trainer runs one forward and backward of the whole model per step; train it with "
            "shardcore.pipeline_step(model, batch) in your own loop"
        )
    if info.layout.dp > 1 and info.data_parallel is None:
        raise ValueError(
            f"shardcore.hf.Trainer: the layout has data_parallel_size={info.layout.dp} but no data parallelism "
            "runs on it, so the replicas would train apart; set ShardConfig(data_parallel='ddp') or 'fsdp'"
        )


def _check_args(args) -> None:
    """Refuse training arguments this Trainer cannot honour, by name."""
    if args.eval_use_gather_object:
        raise NotImplementedError(
            "shardcore.hf.Trainer: eval_use_gather_object=True gathers Python objects over every process, which "
            "would repeat each prediction on every tensor-parallel rank; leave it False (tensors are gathered "
            "over the data-parallel ranks only)"
        )


class _TokensOncePerReplica(transformers.TrainerCallback):
    """transformers 4.x: the tokens its loop counted since the last step (gathered over every
    process) counted once per data-parallel replica, before the step's logs read them."""

    def __init__(self, ranks_per_replica: int) -> None:
        self.ranks, self.counted = ranks_per_replica, 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.counted = state.num_input_tokens_seen  # a resumed run's count, read from its checkpoint

    def on_step_end(self, args, state, control, **kwargs):
        state.num_input_tokens_seen = self.counted + (state.num_input_tokens_seen - self.counted) // self.ranks
        self.counted = state.num_input_tokens_seen


class Trainer(transformers.Trainer):
    """``transformers.Trainer`` for a model sharded by :func:`shardcore.optimize` (see the module doc)."""

    def __init__(self, model=None, *args, **kwargs) -> None:
        _check_model(model)
        super().__init__(model, *args, **kwargs)
        _check_args(self.args)
        info = model.shardcore
        self._dp_size = info.layout.dp
        self._dp_rank = info.layout.coordinates(dist.get_rank())["dp"] if dist.is_initialized() else 0
        accelerator = self.accelerator
        # instance attributes: accelerate's prepare() calls these for the model and the dataloaders,
        # gather_for_metrics (evaluation, prediction) and the Trainer's token counts call gather
        accelerator.prepare_model = self._prepare_model
        accelerator.prepare_data_loader = self._prepare_data_loader
        accelerator.gather_for_metrics = self._gather_for_metrics
        self.gather_function = self._gather_for_metrics  # the Trainer bound the original already
        if not hasattr(transformers.Trainer, "_track_num_input_tokens"):  # 4.x counts inline in its loop
            self.add_callback(_TokensOncePerReplica(self.get_tp_size()))

    def get_tp_size(self) -> int:
        """The ranks that share each batch (tensor x sequence parallel), as the Trainer means it:
        it gathers the label-token counts over every process and divides them by this, and
        scales the loss by the processes over this (``average_tokens_across_devices``)."""
        return _world() // self._dp_size

    def _track_num_input_tokens(self, inputs) -> None:
        """The Trainer's count gathers over every process: each replica's tokens once, not tp x sp times."""
        before = self.state.num_input_tokens_seen
        super()._track_num_input_tokens(inputs)
        self.state.num_input_tokens_seen = before + (self.state.num_input_tokens_seen - before) // self.get_tp_size()

    # -- accelerate -------------------------------------------------------------------------------
    def _prepare_model(self, model, device_placement=None, evaluation_mode=False):
        """The sharded model as ``optimize`` made it: no DDP over the whole world."""
        return model

    def _prepare_data_loader(self, data_loader, device_placement=None, slice_fn_for_dispatch=None):
        """Accelerate's dataloader preparation with the data-parallel degree as its world."""
        from accelerate.data_loader import prepare_data_loader

        acc = self.accelerator
        if getattr(data_loader, "_is_accelerate_prepared", False):
            if data_loader not in acc._dataloaders:
                acc._dataloaders.append(data_loader)
            return data_loader
        prepared = prepare_data_loader(
            data_loader,
            acc.device,
            num_processes=self._dp_size,
            process_index=self._dp_rank,
            split_batches=acc.split_batches,
            put_on_device=acc.device_placement if device_placement is None else device_placement,
            rng_types=acc.rng_types.copy(),
            dispatch_batches=acc.dispatch_batches,
            even_batches=acc.even_batches,
            slice_fn_for_dispatch=slice_fn_for_dispatch,
            use_seedable_sampler=acc.use_seedable_sampler,
            data_seed=acc.dataloader_config.data_seed,
            non_blocking=acc.non_blocking,
            use_stateful_dataloader=acc.use_stateful_dataloader,
        )
        acc._dataloaders.append(prepared)
        return prepared

    def _gather_for_metrics(self, data, use_gather_object: bool = False):
        """accelerate's ``gather_for_metrics`` over the ``dp`` dim only (gathered over every
        process, each prediction and loss would come back once per tensor-parallel rank), the
        samples accelerate repeated to even out the last batch dropped again."""
        from accelerate.utils import recursively_apply

        if use_gather_object:
            raise NotImplementedError("shardcore.hf.Trainer gathers tensors only (eval_use_gather_object=False)")
        from ...distributed.collectives import all_gather_cat

        group = self.model.shardcore.layout.group("dp")

        def one(t: torch.Tensor) -> torch.Tensor:  # bounded and counted, like every shardcore collective
            return all_gather_cat(t[None] if t.ndim == 0 else t, group, 0, where="evaluation (gather_for_metrics)")

        data = recursively_apply(one, data, error_on_other_type=True)
        state = self.accelerator.gradient_state
        if state.end_of_dataloader and state.remainder > 0:
            data = recursively_apply(lambda t: t[: state.remainder], data)
        return data

    # -- checkpoints ------------------------------------------------------------------------------
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Every rank saves: ``save_pretrained`` gathers the full tensors (transformers 4.x calls
        ``_save`` on the main process alone, which would leave it waiting for the others)."""
        self._save(output_dir)
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save")

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """Every rank joins ``save_pretrained`` (the full tensors are gathered); the main process
        also writes the processing class and the training arguments, as the Trainer does."""
        if state_dict is not None:
            raise ValueError(
                "shardcore.hf.Trainer saves the model itself (save_pretrained on every rank); no state_dict"
            )
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        self.model.save_pretrained(output_dir, is_main_process=self.args.should_save)
        if not self.args.should_save:
            return
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)
        torch.save(self.args, os.path.join(output_dir, transformers.trainer.TRAINING_ARGS_NAME))

    def _optimizer_file(self, directory: str) -> str:
        world = dist.get_world_size() if dist.is_initialized() else 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        return os.path.join(directory, f"optimizer.rank{rank}-of-{world}.pt")

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """Each rank's optimizer state (of its slices) in its own file; the schedule once."""
        torch.save(
            {"layout": self.model.shardcore.layout.degrees, "optimizer": self.optimizer.state_dict()},
            self._optimizer_file(output_dir),
        )
        if self.args.should_save:
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is None:
            return
        path = self._optimizer_file(checkpoint)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"shardcore.hf.Trainer: {path} is missing: resume_from_checkpoint needs the checkpoint saved by "
                "shardcore.hf.Trainer at the same layout (the same world size and degrees)"
            )
        state = torch.load(path, map_location="cpu", weights_only=True)
        layout = self.model.shardcore.layout.degrees
        if state["layout"] != layout:
            raise ValueError(
                f"shardcore.hf.Trainer: the checkpoint's optimizer state was saved at layout {state['layout']}, this "
                f"run is {layout}; resume at the same layout (the weights alone load at any layout: "
                "shardcore.load_checkpoint)"
            )
        self.optimizer.load_state_dict(state["optimizer"])
        schedule = torch.load(os.path.join(checkpoint, SCHEDULER_NAME), map_location="cpu", weights_only=True)
        self.lr_scheduler.load_state_dict(schedule)

    def _save_checkpoint(self, model, trial) -> None:
        """The Trainer's checkpoint, then, once every rank's files are written, the record of them
        (:mod:`shardcore.checkpoint.atomic`, written last): a checkpoint without it was interrupted."""
        super()._save_checkpoint(model, trial)
        if dist.is_initialized():
            barrier(where="shardcore.hf.Trainer: every rank's checkpoint files are written")
        if self.args.should_save:
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            atomic.record(pathlib.Path(self._get_output_dir(trial=trial)) / folder)
        if dist.is_initialized():
            barrier(where="shardcore.hf.Trainer: the checkpoint is recorded")

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """``Trainer.train``; ``resume_from_checkpoint=True`` resumes from the newest *complete*
        checkpoint (an interrupted one is named and passed over), a path must be a complete one."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = _newest_complete(pathlib.Path(self.args.output_dir))
        elif resume_from_checkpoint:
            atomic.check_recorded(pathlib.Path(resume_from_checkpoint), "shardcore.hf.Trainer checkpoint")
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        from ...checkpoint import load_checkpoint

        load_checkpoint(self.model if model is None else model, resume_from_checkpoint)

    def _load_best_model(self) -> None:
        self._load_from_checkpoint(self.state.best_model_checkpoint)
