"""(``nox -s "engine(name='lightning')"``: a fresh environment with ``shardcore[test,lightning]`` and transformers
alone; the suite's own sessions leave the ``engine`` tests out.) Lightning Fabric's ``ModelParallelStrategy`` with shardcore as its ``parallelize_fn``
(``examples/lightning_fabric.py``), on the pool's gloo ranks (to Lightning: processes torchrun
started, ``TORCHELASTIC_RUN_ID`` set): TP=2 and FSDP=2 x TP=2 give the unsharded loop's losses, a
``shardcore.save_distributed`` checkpoint loads back exactly, the Trainer (``examples/lightning_trainer.py``,
shardcore in ``configure_model``) trains as the unsharded loop, and Lightning's own ``fabric.save``,
whose distributed checkpoint would keep one rank's slices, is refused by name."""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys

import pytest

from shardcore.testing import example_main, run_on_ranks

pytestmark = pytest.mark.engine
EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "lightning_fabric.py"
TRAINER = EXAMPLE.with_name("lightning_trainer.py")


@contextlib.contextmanager
def _started_by_torchrun():
    """The pool's ranks are processes torchrun could have started (RANK, LOCAL_RANK, MASTER_ADDR set): with
    ``TORCHELASTIC_RUN_ID`` Lightning takes them as such and spawns none; unset again after."""
    os.environ["TORCHELASTIC_RUN_ID"] = "shardcore-tests"
    try:
        yield
    finally:
        del os.environ["TORCHELASTIC_RUN_ID"]


def _fabric(argv: list[str]) -> list[float]:
    with _started_by_torchrun():
        return example_main(EXAMPLE)(argv)


@pytest.mark.parametrize(("tp", "dp"), [(2, 1), (2, 2)])
def test_fabric_with_shardcore_equals_the_unsharded_loop_and_reloads(tp, dp, tmp_path):
    argv = ["--tp", str(tp), "--dp", str(dp), "--checkpoint", str(tmp_path / "checkpoint")]
    unsharded = example_main(EXAMPLE)(["--unsharded"])  # this process, the plain model on the whole batch
    for got in run_on_ranks(tp * dp, _fabric, argv):
        losses, reloaded = got[:-1], got[-1]
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses, unsharded, strict=True)), (losses, unsharded)
        assert reloaded == 0.0, got


def _trainer(argv: list[str]) -> list[float]:
    with _started_by_torchrun():
        return example_main(TRAINER)(argv)


def test_the_trainer_with_shardcore_in_configure_model_equals_the_unsharded_loop(tmp_path):
    """FSDP=2 x TP=2 through the Trainer's sampler (the batch split over data_parallel alone); the
    checkpoint on_train_end writes is shardcore's, complete."""
    unsharded = example_main(TRAINER)(["--unsharded"])
    argv = ["--tp", "2", "--dp", "2", "--checkpoint", str(tmp_path / "checkpoint")]
    for losses in run_on_ranks(4, _trainer, argv):
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses, unsharded, strict=True)), (losses, unsharded)
    assert (tmp_path / "checkpoint" / "shardcore_complete.json").is_file()


def _fabric_save(path: str) -> str:
    import shardcore

    with _started_by_torchrun():
        example_main(EXAMPLE)  # imported: its tiny model
        from lightning_fabric import Fabric
        from lightning_fabric.strategies import ModelParallelStrategy

        def parallelize(model, mesh):
            return shardcore.optimize(model, shardcore.ShardConfig(device_mesh=mesh, data_parallel="fsdp"))

        strategy = ModelParallelStrategy(parallelize_fn=parallelize, data_parallel_size=2, tensor_parallel_size=2)
        fabric = Fabric(accelerator="cpu", devices=4, strategy=strategy)
        fabric.launch()
        model = fabric.setup(sys.modules["shardcore_example_lightning_fabric"]._model())
        try:
            fabric.save(path, {"model": model})
        except RuntimeError as exc:
            return str(exc)
        return "no error"


def test_fabric_save_is_refused_by_name_under_fsdp_by_tp(tmp_path):
    for message in run_on_ranks(4, _fabric_save, str(tmp_path / "checkpoint")):
        assert "(_get_model_state_dict; Lightning's fabric.save" in message, message
    assert not (tmp_path / "checkpoint").exists()
