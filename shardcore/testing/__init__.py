"""The conformance kit every plugin (and third parties) test with.

* the rank launcher (:mod:`shardcore.distributed.launcher`): :func:`run_on_ranks`, :class:`RankPool`;
* ``conformance.py``: :func:`assert_sharded_matches` (outputs, loss, every gradient, AdamW steps),
  :func:`hidden_state_loss`; ``structure.py``: :func:`check_blocks` and the checks that sharding
  happened (parallel modules in every block, each rank's slices);
* ``generation.py``: :func:`assert_generate_matches` (tokens and per-step scores, with inputs that
  make it able to fail), :func:`assert_generate_through_stages` (greedy generation through pipeline stages);
* ``checkpoints.py``: :func:`assert_lazy_load_matches`, :func:`assert_same_checkpoint`,
  :func:`train_and_save` / :func:`assert_resume_matches` (save at one layout, resume at another);
* ``data_parallel.py``: :func:`assert_data_parallel_matches` (FSDP / DDP x TP trains like the
  unsharded model on the whole batch; bytes of parameters and optimizer state per rank);
* ``pipeline.py``: :func:`assert_pipeline_matches` (``pipeline_step`` over the stages trains like
  the unsharded model on the whole batch; names kept, every parameter held somewhere);
* ``clipping.py``: :func:`assert_clipping_matches` (the user's ``torch.nn.utils.clip_grad_norm_``
  gives the unsharded norm and clipped gradients, for every layout);
* ``saving.py``: :func:`assert_save_pretrained_matches` (HF's ``save_pretrained`` on every rank
  writes the checkpoint ``from_pretrained`` loads unsharded);
* ``explained.py``: :func:`assert_explain_matches` (``shardcore explain`` predicts a real step);
* ``refusals.py``: :func:`refusal_message` (bad input fails on every rank before any collective,
  nobody hangs), :func:`count_c10d_calls`, :func:`rank_zero_only` (the ``if rank == 0:`` mistake
  ends in a named error on rank 0);
* ``tolerance.py``: every tolerance the kit compares with, and why (relative to what is compared),
  and the margin each comparison kept; ``compare.py``: :func:`assert_outputs_close` and
  :func:`assert_trained_close`, the same comparisons for a test's own tensors;
* ``suite.py``: :class:`Family`, :class:`Case`, :class:`Refusal`: a family's conformance tests as lists
  of cases (``test_matches_unsharded = FAMILY.matches(Case(...), ...)``), the checks above run on the ranks;
* ``batches.py``: :func:`token_batch` (ids, mask and labels of a tiny text model, one row padded);
* ``syncs.py``: :func:`record_syncs` with :func:`as_watchdog_backend` (the sync audit: the host
  syncs shardcore's code makes in a step, its collectives on their GPU path).

A typical plugin test::

    from shardcore import ShardConfig
    from shardcore.testing import assert_sharded_matches, run_on_ranks

    def _check(tp):                        # module level: runs on every rank
        assert_sharded_matches(build_model, make_batch(), ShardConfig(tensor_parallel_size=tp))

    def test_tp2():
        run_on_ranks(2, _check, 2)
"""

from ..distributed.launcher import RankError, RankPool, close_pools, run_on_ranks
from .attached import assert_attachments_listed
from .batches import token_batch
from .checkpoints import (
    assert_lazy_load_matches,
    assert_resume_matches,
    assert_same_checkpoint,
    rows_read,
    train_and_save,
)
from .clipping import CLIP_CALLS, assert_clipping_matches, exact_norm
from .compare import output_close as assert_outputs_close
from .conformance import (
    SWITCHES,
    assert_sharded_matches,
    assert_switch_matches,
    flash_refused_here,
    hidden_state_loss,
    switch_refusal,
)
from .data_parallel import assert_data_parallel_matches, dp_part, state_bytes
from .examples import example_main
from .explained import assert_explain_matches
from .generation import assert_generate_matches, assert_generate_through_stages
from .pipeline import assert_pipeline_matches
from .refusals import count_c10d_calls, rank_zero_only, refusal_message
from .saving import assert_save_pretrained_matches
from .sequence import dropout_patterns
from .steps import assert_trained_close
from .structure import check_blocks
from .suite import Case, Family, Refusal
from .syncs import Sync, as_watchdog_backend, device_strict, record_syncs

__all__ = [
    "CLIP_CALLS",
    "SWITCHES",
    "Case",
    "Family",
    "RankError",
    "RankPool",
    "Refusal",
    "Sync",
    "as_watchdog_backend",
    "assert_attachments_listed",
    "assert_clipping_matches",
    "assert_data_parallel_matches",
    "assert_explain_matches",
    "assert_generate_matches",
    "assert_generate_through_stages",
    "assert_lazy_load_matches",
    "assert_outputs_close",
    "assert_pipeline_matches",
    "assert_resume_matches",
    "assert_same_checkpoint",
    "assert_save_pretrained_matches",
    "assert_sharded_matches",
    "assert_switch_matches",
    "assert_trained_close",
    "check_blocks",
    "close_pools",
    "count_c10d_calls",
    "device_strict",
    "dp_part",
    "dropout_patterns",
    "exact_norm",
    "example_main",
    "flash_refused_here",
    "hidden_state_loss",
    "rank_zero_only",
    "record_syncs",
    "refusal_message",
    "rows_read",
    "run_on_ranks",
    "state_bytes",
    "switch_refusal",
    "token_batch",
    "train_and_save",
]
