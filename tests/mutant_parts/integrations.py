"""Mutants of integrations: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "deferred-gather-returns-the-slice",
        "with the loss computed on the slices, the causal LM's output keeps this rank's vocabulary slice, not the gathered logits",
        "shardcore/integrations/hf/causal_lm_loss.py",
        "_put_full_logits",
        [("    output[at] = full\n", "    output[at] = value\n")],
        "plugins/shard-llama/tests/test_llama_tp.py::test_causal_lm[2]",
        "output 'logits': shape (2, 12, 64) != unsharded (2, 12, 128)",
    ),
    m(
        "lora-a-gradient-not-summed",
        "a column layer's replicated LoRA A keeps its partial gradient (no all-reduce)",
        "shardcore/integrations/hf/peft.py",
        "_column",
        [
            (
                '    a.weight.register_hook(summed_over(group, f"backward of {where}.lora_A (replicated, partial gradients)"))\n',
                "",
            )
        ],
        "tests/integration/test_llama_peft.py::test_lora_matches_unsharded_peft_model[lora-then-optimize-2]",
        "lora_A.default.weight",
    ),
    m(
        "trainer-batches-over-world",
        "shardcore.hf.Trainer sharding batches over every process instead of the dp dim",
        "shardcore/integrations/hf/trainer.py",
        "Trainer._prepare_data_loader",
        [
            (
                "            acc.device,\n            num_processes=self._dp_size,\n            process_index=self._dp_rank,\n",
                "            acc.device,\n            num_processes=acc.num_processes,\n            process_index=acc.process_index,\n",
            )
        ],
        "tests/integration/test_llama_trainer.py::test_trains_like_one_process_trainer[tp2]",
        "InputMismatch",
    ),
    m(
        "trainer-eval-gathered-over-world",
        "shardcore.hf.Trainer's evaluation gathering predictions over every process (once per TP rank)",
        "shardcore/integrations/hf/trainer.py",
        "Trainer.__init__",
        [
            (
                "        accelerator.gather_for_metrics = self._gather_for_metrics\n        self.gather_function = self._gather_for_metrics  # the Trainer bound the original already\n",
                "",
            )
        ],
        "tests/integration/test_llama_trainer.py::test_evaluate_and_predict_like_one_process[tp2]",
        "torch.Size([12, 12, 128])",
    ),
    m(
        "pipeline-padding-counted",
        "pipeline: a causal LM's microbatch losses divided by every label position, ignored (-100) ones included",
        "shardcore/integrations/hf/stages.py",
        "HFStages._pp_num_items",
        [("            return (labels[..., 1:] != -100).sum()  #", "            return labels[..., 1:].numel()  #")],
        "plugins/shard-llama/tests/test_llama_pipeline.py::test_pipeline_trains_like_unsharded[gpipe]",
        "pipeline_step loss 3.741",
    ),
    m(
        "trainer-resumes-an-interrupted-checkpoint",
        "resume_from_checkpoint=True takes the newest checkpoint-N whether or not its save completed",
        "shardcore/integrations/hf/trainer.py",
        "_newest_complete",
        [('            atomic.check_recorded(directory, "shardcore.hf.Trainer checkpoint")', "            pass")],
        "tests/test_core_checkpoint_safety.py::test_resume_passes_over_an_interrupted_checkpoint_and_refuses_one_named",
        "not the newest complete checkpoint-2",
        fast=True,
    ),
    m(
        "sdpa-gqa-keys-for-values",
        "shardcore's SDPA for grouped K/V on the CPU swaps keys and values: the same wrong kernel in the sharded run and its same-kernel reference",
        "shardcore/integrations/hf/attention.py",
        "hf_sdpa_attention",
        [
            (
                "            query, key, value, attn_mask=attention_mask,",
                "            query, value, key, attn_mask=attention_mask,",
            )
        ],
        "plugins/shard-llama/tests/test_llama_kernels.py::test_optimization_flags_at_tp2[flash]",
        "output 'logits': max abs diff 0.763 >",
    ),
    m(
        "save-rendezvous-on-the-default-device",
        "save_pretrained's rendezvous tensor made without a device (a CPU tensor on an NCCL group)",
        "shardcore/integrations/hf/save.py",
        "_rendezvous",
        [("torch.zeros(1, device=group_device(world))", "torch.zeros(1)")],
        "tests/integration/test_llama_device_audit.py::test_every_collective_gets_a_tensor_on_the_model_s_device[save_pretrained]",
        "all_reduce (save_pretrained of a sharded model: every rank must call it",
    ),
    m(
        "checkpointing-recompute-without-streams",
        "HF gradient checkpointing's function is not wrapped: the recompute runs without shardcore's random streams",
        "shardcore/integrations/hf/checkpointing.py",
        "carry_into_checkpoints.wrap",
        [("                sub._gradient_checkpointing_func = _carrying(func, carried)", "                pass")],
        "plugins/shard-bert/tests/test_bert_dropout.py::test_gradient_checkpointing_is_exact",
        "a block recomputed by gradient (activation) checkpointing drew random numbers on its per-rank stream",
    ),
    m(
        "hf-kv-heads-as-heads",
        "attention_dims reads a GQA config's key/value heads as many as its query heads",
        "shardcore/integrations/hf/heads.py",
        "attention_dims",
        [('    kv = getattr(config, "num_key_value_heads", None) or heads\n', "    kv = heads\n")],
        "plugins/shard-llama/tests/test_llama_tp.py::test_causal_lm_variants[gqa-2]",
        "expected size 64 along dim 0, got shape (32, 64)",
    ),
]
