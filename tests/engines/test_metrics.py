"""(``nox -s "engine(name='metrics')"``: a fresh environment with ``shardcore[test,metrics]``: tensorboard,
wandb and mlflow-skinny.) ``shardcore.StepMetrics`` of a TP=2 loop written to a TensorBoard event file, a W&B
offline run and an MLflow run (its file store), each read back: every window's tokens/s, MFU, step time, peak memory and loss, at the window's step."""

from __future__ import annotations

import glob
import json
import os
import pathlib
import struct
import sys

import pytest
import torch

TESTS = pathlib.Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))  # toy_models, here and on the ranks (which start from this process's path)

from toy_models import ToyLM, ToyPolicy, toy_batch  # noqa: E402

import shardcore  # noqa: E402
from shardcore import ShardConfig  # noqa: E402
from shardcore.testing import run_on_ranks  # noqa: E402

pytestmark = pytest.mark.engine
os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's file store, here and on the ranks
KEYS = ("tokens_per_s", "mfu", "step_s", "peak_memory_gb", "loss")


def _train_and_log(out: str) -> list[dict]:
    import torch.distributed as dist

    run = None
    if dist.get_rank() == 0:
        import mlflow
        import wandb

        run = wandb.init(project="shardcore-tests", dir=out, mode="offline")
        mlflow.set_tracking_uri(f"file://{out}/mlruns")  # MLflow's file store (MLFLOW_ALLOW_FILE_STORE set)
        mlflow.start_run()
    torch.manual_seed(0)
    model = shardcore.optimize(ToyLM(), ShardConfig(tensor_parallel_size=2), policy=ToyPolicy)
    # --8<-- [start:sinks]
    sinks = [
        shardcore.metrics.tensorboard(f"{out}/tensorboard"),
        shardcore.metrics.wandb(run),
        shardcore.metrics.mlflow(),
    ]
    metrics = shardcore.StepMetrics(model, log_every=2, peak_flops=1e9, sinks=sinks, total=4)  # peak: stated
    # --8<-- [end:sinks]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch, windows = toy_batch(batch=2, seq=8), []
    for _ in range(4):
        loss = model(**batch)["loss"]
        loss.backward()
        opt.step()
        opt.zero_grad()
        window = metrics.step(loss, tokens=batch["ids"].numel())
        if window is not None:
            windows.append(window)
    metrics.close()
    if run is not None:
        import mlflow

        run.finish()
        mlflow.end_run()
    return windows


def _wandb_history(out: pathlib.Path) -> list[dict]:
    """The history records of the offline run's ``.wandb`` file (W&B's record log: 32 KiB blocks, each
    record a 7-byte header, crc, length, type, then a ``Record`` protobuf, split over blocks)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = glob.glob(str(out / "wandb" / "offline-run-*" / "run-*.wandb"))
    data, pos, rows, buf, block = pathlib.Path(path).read_bytes(), 7, [], b"", 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header: padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        buf, pos = buf + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            buf = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_a_tp2_loop_writes_tensorboard_wandb_offline_and_mlflow_and_each_reads_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    windows = run_on_ranks(2, _train_and_log, str(tmp_path))[0]
    assert len(windows) == 2
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    for key in KEYS:
        scalars = events.Scalars(key)
        assert [s.step for s in scalars] == [2, 4], (key, scalars)
        for scalar, window in zip(scalars, windows, strict=True):
            assert abs(scalar.value - window[key]) <= 1e-6 * abs(window[key]), (key, scalar, window)
    history = _wandb_history(tmp_path)
    assert [row["_step"] for row in history] == [2, 4], history
    for row, window in zip(history, windows, strict=True):
        assert all(row[key] == window[key] for key in KEYS), (row, window)
    import mlflow

    mlflow.set_tracking_uri(f"file://{tmp_path}/mlruns")
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    for key in KEYS:
        logged = mlflow.MlflowClient().get_metric_history(run.info.run_id, key)
        assert [m.step for m in logged] == [2, 4], (key, logged)
        assert all(abs(m.value - w[key]) <= 1e-12 * abs(w[key]) for m, w in zip(logged, windows, strict=True)), key
