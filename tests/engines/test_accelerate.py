"""(``nox -s "engine(name='accelerate')"``: a fresh environment with ``shardcore[test,accelerate]`` and
transformers alone.) An accelerate loop (``examples/accelerate_loop.py``: ``Accelerator``,
``accelerator.prepare(optimizer)``, ``backward``, ``clip_grad_norm_``, ``reduce``) with shardcore
sharding on the mesh accelerate's ``ParallelismConfig`` builds, on the pool's gloo ranks: TP=2 and
FSDP=2 x TP=2 give the unsharded loop's losses; ``accelerator.prepare(model)`` is right at TP alone
(its DDP over every process leaves the slices alone) and refused by name around shardcore's FSDP."""

from __future__ import annotations

import pathlib

import pytest

from shardcore.testing import example_main, run_on_ranks

pytestmark = pytest.mark.engine
EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "accelerate_loop.py"


def _loop(argv: list[str]) -> list[float] | str:
    import accelerate

    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)  # a fresh state per run
    accelerate.state.GradientState._reset_state()
    try:
        return example_main(EXAMPLE)(argv)
    except RuntimeError as err:
        return str(err)


@pytest.mark.parametrize(
    ("tp", "dp", "prepare_model"), [(2, 1, False), (2, 1, True), (2, 2, False)], ids=["tp", "tp-prepared", "fsdp-tp"]
)
def test_the_accelerate_loop_with_shardcore_equals_the_unsharded_loop(tp, dp, prepare_model):
    unsharded = example_main(EXAMPLE)(["--unsharded"])  # this process, the plain model on the whole batch
    argv = ["--tp", str(tp), "--dp", str(dp)] + (["--prepare-model"] if prepare_model else [])
    for losses in run_on_ranks(tp * dp, _loop, argv):
        assert not isinstance(losses, str), losses
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses, unsharded, strict=True)), (losses, unsharded)


def test_preparing_the_model_around_shardcores_fsdp_is_refused_by_name():
    for message in run_on_ranks(4, _loop, ["--tp", "2", "--dp", "2", "--prepare-model"]):
        assert "its data parallelism is shardcore's already (data_parallel='fsdp' over dp=2)" in message, message
        assert "accelerator.prepare(optimizer)" in message, message
