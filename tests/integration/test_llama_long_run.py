"""A long run stays flat: a few hundred training steps (forward, backward, torch's clip_grad_norm_,
AdamW) at TP=2, pipelined (PP=2) and FSDP x TP (2 x 2). After a warm-up the process's resident memory
grows by less than RSS_BOUND, the collectives of every step are the same as the first steady step's,
and the works shardcore keeps for a clean exit stay at their bound: nothing shardcore attaches (the
first-step check, the input check, the gradient marks, the kept works) grows with the step count."""

from __future__ import annotations

import os

import pytest
import torch
from llama_cases import build, lm_batch

from shardcore import ShardConfig
from shardcore.testing import run_on_ranks

pytestmark = pytest.mark.slow

STEPS, WARM = 300, 50
#: resident-memory growth allowed from step WARM to step STEPS (a 2,000-step run grew 6 MB in all:
#: the allocator's and Python's noise; one leaked activation buffer per step is ~10 MB here)
RSS_BOUND = 8 * 2**20

LAYOUTS = {
    "tp2": (2, {"tensor_parallel_size": 2}),
    "pp2": (2, {"pipeline_parallel_size": 2, "num_microbatches": 2}),
    "fsdp2xtp2": (4, {"tensor_parallel_size": 2, "data_parallel": "fsdp"}),
}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _train(layout: str) -> dict:

    import shardcore
    from shardcore.distributed import retain
    from shardcore.distributed.collectives import count_collectives

    torch.manual_seed(0)
    config = ShardConfig(**LAYOUTS[layout][1])
    model = shardcore.optimize(build("LlamaForCausalLM"), config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = lm_batch()
    rss, counts, kept = [], [], []
    for _ in range(STEPS):
        with count_collectives() as step:
            if config.pipeline_parallel_size > 1:
                shardcore.pipeline_step(model, batch)
            else:
                model(**batch).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        counts.append(dict(step))
        rss.append(_rss())
        kept.append(retain.kept())
    return {"rss": rss, "counts": counts, "kept": kept}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_long_run_stays_flat(layout):
    for rank, run in enumerate(run_on_ranks(LAYOUTS[layout][0], _train, layout)):
        grew = run["rss"][-1] - run["rss"][WARM]
        assert grew < RSS_BOUND, f"rank {rank}: resident memory grew {grew / 2**20:.1f} MiB from step {WARM} to {STEPS}"
        steady = run["counts"][2]
        changed = [i for i, c in enumerate(run["counts"][2:], start=2) if c != steady]
        assert not changed, f"rank {rank}: the collectives of steps {changed[:5]} differ from step 2's {steady}"
        assert len(set(run["kept"][WARM:])) == 1, (
            f"rank {rank}: the kept works grew: {run['kept'][WARM]} -> {run['kept'][-1]}"
        )
