"""Mutants of losses: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "moved-loss-name-dropped",
        "a loss-glue name moved out of shardcore.losses no longer resolves there: a 0.1 plugin breaks before 0.3",
        "shardcore/losses.py",
        "",
        [('_MOVED = ("defer_logits_gather", "loss_on_head_slices")', '_MOVED = ("defer_logits_gather",)')],
        "tests/test_core_moved_imports.py::test_the_causal_lm_loss_glue_s_old_names_in_losses_warn_and_are_the_new_code",
        "has no attribute 'loss_on_head_slices'",
    ),
    m(
        "loss-ignores-num-items",
        "the vocab-parallel causal-LM loss drops num_items_in_batch: a token-weighted loss over data-parallel parts is each part's mean",
        "shardcore/losses.py",
        "causal_lm_loss_on_slices",
        [("        num_items_in_batch=num_items_in_batch,\n    )\n", "        num_items_in_batch=None,\n    )\n")],
        "tests/integration/test_llama_data_parallel.py::test_uneven_label_counts_train_like_the_whole_batch_with_the_token_weighted_loss[ddp-2-2]",
        "token-weighted loss under ddp: gradients off by",
    ),
    m(
        "loss-counts-padding-tokens",
        "a token loss's count includes the -100 (ignored) labels: a pipeline's padded microbatches are scaled down",
        "shardcore/losses.py",
        "token_items",
        [("    return (labels != -100).sum()", "    return torch.tensor(labels.numel())")],
        "plugins/shard-bert/tests/test_bert_pipeline.py::test_pipeline_trains_like_unsharded[mlm-gpipe]",
        "pipeline_step loss 1.1327",
    ),
]
