"""Mutants of tensor_parallel: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "no-replica-grad-sync",
        "replicated KV heads' gradients not summed over their replicas (_SyncReplicaGrads skipped)",
        "shardcore/tensor_parallel/linear.py",
        "Linear1D_Col._weights",
        [("        if self._replica_groups is not None and torch.is_grad_enabled():", "        if False:")],
        "plugins/shard-llama/tests/test_llama_tp.py::test_causal_lm_variants[gqa-4]",
        "gradient of model.layers.0.self_attn.k_proj.weight (gathered): relative error",
    ),
    m(
        "copy-to-tp-backward-dropped",
        "Megatron's f without its backward all-reduce: input gradients stay partial",
        "shardcore/tensor_parallel/mappings.py",
        "_CopyToTP.backward",
        [
            (
                "        return all_reduce(grad.contiguous().clone(), ctx.group, where=ctx.where), None",
                "        return grad, None",
            )
        ],
        "tests/test_core_toy.py::test_toy_model_matches_unsharded[128-2]",
        "gradient of embed.weight (gathered): relative error 0.7",
        fast=True,
    ),
    m(
        "copy-to-tp-backward-scaled",
        "copy_to_tp's backward all-reduce scaled by the group size",
        "shardcore/tensor_parallel/mappings.py",
        "_CopyToTP.backward",
        [
            (
                "        return all_reduce(grad.contiguous().clone(), ctx.group, where=ctx.where), None",
                "        return all_reduce(grad.contiguous().clone(), ctx.group, where=ctx.where) * group_size(ctx.group), None",
            )
        ],
        "tests/test_core_toy.py::test_toy_model_matches_unsharded[128-2]",
        "gradient of embed.weight (gathered): relative error 11 > 0.0001",
    ),
    m(
        "mapping-breaks-the-graph",
        "copy_to_tp kept out of torch.compile again: a compiled tensor-parallel block breaks at each region entry",
        "shardcore/tensor_parallel/mappings.py",
        "copy_to_tp",
        [("def copy_to_tp(", "@torch.compiler.disable\ndef copy_to_tp(")],
        "tests/test_core_compile.py::test_a_compiled_tensor_parallel_block_is_one_graph_with_its_collectives_in_it",
        "torch._dynamo.exc.Unsupported",
    ),
    m(
        "traced-backward-reduce-skipped",
        "in a compiled graph Megatron's f keeps its gradient partial (no backward all-reduce)",
        "shardcore/tensor_parallel/mappings.py",
        "_CopyToTP.backward",
        [("            return traced.all_reduce(grad, ctx.group), None", "            return grad, None")],
        "tests/test_core_compile.py::test_a_compiled_tensor_parallel_block_is_one_graph_with_its_collectives_in_it",
        "the compiled block's gradients differ from the eager one's",
    ),
    m(
        "row-parallel-split-on-output-dim",
        "a row-parallel layer holding a slice of its output features (rows) instead of its input features",
        "shardcore/tensor_parallel/linear.py",
        "Linear1D_Row.__init__",
        [
            ("        in_dim = 0 if self.transposed else 1\n", "        in_dim = 0 if self.transposed else 1\n"),
            (
                '        self._shard_param("weight", weight, spec)\n        self._shard_param("bias", bias, None)\n',
                '        self._shard_param("weight", weight, spec)\n        self._shard_param("bias", bias, None)\n        self.weight.data = weight.detach().chunk(self.tp_size, 1 - in_dim)[self.tp_rank].contiguous()\n',
            ),
        ],
        "tests/test_core_toy.py::test_toy_model_matches_unsharded[128-2]",
        "blocks.0.proj.weight: this rank's tensor is not its slice",
    ),
    m(
        "qkv-order-permuted",
        "q/k/v parts permuted in FusedLinear1D_Col (rank holds [v; k; q] rows)",
        "shardcore/tensor_parallel/linear.py",
        "FusedLinear1D_Col.from_native_module",
        [
            (
                "        return cls(weight, bias, spec, process_group, copy_input=copy_input)",
                "        weight = torch.cat(weight.detach().chunk(3, dim=1 if cls.transposed else 0)[::-1], 1 if cls.transposed else 0)\n        return cls(weight, bias, spec, process_group, copy_input=copy_input)",
            )
        ],
        "tests/test_core_toy.py::test_toy_model_matches_unsharded[128-2]",
        "blocks.0.qkv.weight: this rank's tensor is not its slice",
    ),
    m(
        "vocab-padding-leaks",
        "vocab padding columns leak into vocab-parallel logits (LM head keeps its padded slice)",
        "shardcore/tensor_parallel/embedding.py",
        "VocabParallelLMHead1D.forward",
        [("        local = logits[..., : self.vocab_end - self.vocab_start]\n", "        local = logits\n")],
        "plugins/shard-llama/tests/test_llama_tp.py::test_parallel_output_vocab_parallel_loss[vocab1001-2]",
        "vs unsharded",
    ),
    m(
        "attention-dropout-shared-stream",
        "attention dropout on the shared random stream (every rank drops the same positions of its heads)",
        "shardcore/tensor_parallel/rng.py",
        "run_in_tp_rng",
        [("    _wrap(module, lambda device: fork_tp_rng(group, device))", "    _wrap(module, _shared_stream)")],
        "plugins/shard-bert/tests/test_bert_dropout.py::test_attention_dropout_uses_the_per_rank_stream",
        "a training forward left the tensor-parallel random stream where it was",
    ),
    m(
        "tp-rng-without-rank",
        "fork_tp_rng seeded without the tensor-parallel rank (every rank draws the same masks)",
        "shardcore/tensor_parallel/rng.py",
        "fork_tp_rng",
        [("        seed = key[2] + SEED_OFFSET + group_rank(group)", "        seed = key[2] + SEED_OFFSET")],
        "plugins/shard-bert/tests/test_bert_dropout.py::test_per_rank_stream",
        "ranks must drop different heads",
    ),
    m(
        "reduce-in-place-unasked",
        "reduce_from_tp sums any contiguous input in place, also one the caller still holds",
        "shardcore/tensor_parallel/mappings.py",
        "_ReduceFromTP.forward",
        [
            (
                "        if fresh and x.is_contiguous() and not selective_active():",
                "        if x.is_contiguous() and not selective_active():",
            )
        ],
        "tests/test_core_layers.py::test_reduce_from_tp_sums_in_place_only_a_fresh_partial_sum",
        "_reduce_leaves_its_input failed",
    ),
    m(
        "recompute-draws-unchecked",
        "a checkpointed block's recompute draws other per-rank dropout masks than its forward, unnoticed",
        "shardcore/tensor_parallel/rng.py",
        "fork_tp_rng",
        [("        raise RuntimeError(RECOMPUTE_DRAWS)\n", "        pass\n")],
        "plugins/shard-bert/tests/test_bert_dropout.py::test_a_checkpoint_shardcore_does_not_see_is_refused",
        "a checkpoint shardcore does not see ran unrefused",
    ),
    m(
        "recompute-streams-not-replayed",
        "HF gradient checkpointing recomputes per-rank dropout from the live streams, not the forward's",
        "shardcore/tensor_parallel/rng.py",
        "_Streams.restore",
        [
            (
                "        live = dict(_STATES)\n        _STATES.clear()\n        _STATES.update(token)\n",
                "        live = dict(_STATES)\n        _STATES.clear()\n        _STATES.update(live)\n",
            )
        ],
        "plugins/shard-bert/tests/test_bert_dropout.py::test_gradient_checkpointing_is_exact",
        "checkpointed gradients off by",
    ),
    m(
        "recompute-split-state-lost",
        "a block recomputed under sequence parallelism runs as if its forward had not been split (its 6 tokens against the 12 positions of the whole sequence)",
        "shardcore/tensor_parallel/regions.py",
        "SequenceParallel.restore",
        [
            (
                "        (self.active, self.attention_calls), self.checkpointing = token, True\n",
                "        (self.active, self.attention_calls), self.checkpointing = (False, 0), True\n",
            )
        ],
        "plugins/shard-llama/tests/test_llama_sequence.py::test_gradient_checkpointing_matches_unsharded",
        "must match the size of tensor b (12)",
    ),
    m(
        "split-norm-backward-not-summed",
        "SplitRMSNorm: the sum of squares' gradient left at this rank's share (backward all-reduce dropped)",
        "shardcore/tensor_parallel/split_norm.py",
        "_SumEverywhere.backward",
        [
            (
                '        return all_reduce(grad.contiguous().clone(), ctx.group, where="backward of split RMSNorm"), None',
                "        return grad, None",
            )
        ],
        "plugins/shard-moe/tests/test_moe_tp.py::test_matches_unsharded[olmoe-tp2]",
        "gradient of model.",
    ),
    m(
        "column-embedding-next-rank-heads",
        "ColumnParallelEmbedding1D: each rank holds the next rank's heads' columns of the table (T5's relative bias)",
        "shardcore/tensor_parallel/column_embedding.py",
        "ColumnParallelEmbedding1D.__init__",
        [
            (
                '        self._shard_param("weight", weight, spec)\n',
                '        self._shard_param("weight", weight.roll(-spec.local_size, dims=1), spec)\n',
            )
        ],
        "plugins/shard-t5/tests/test_t5_tp.py::test_matches_unsharded[t5-tp2]",
        "this rank's tensor is not its slice of the unsharded parameter",
    ),
    m(
        "explain-row-bytes-of-its-slice",
        "explain: a row-parallel layer's all-reduce counted at its input slice's width, not its output's",
        "shardcore/tensor_parallel/linear.py",
        "Linear1D_Row.collective_bytes",
        [
            (
                '        return {"forward": [tokens * self.out_features * itemsize], "backward": backward}',
                '        return {"forward": [tokens * self.spec.local_size * itemsize], "backward": backward}',
            )
        ],
        "plugins/shard-llama/tests/test_llama_kernels.py::test_explain_predicts_a_step[gqa]",
        "bytes per step, this rank put",
    ),
    m(
        "shard-spec-replicas-interleaved",
        "replicated KV heads dealt round robin (rank r holds head r % n), cut and gathered alike",
        "shardcore/tensor_parallel/shard_spec.py",
        "ShardSpec",
        [
            ("        return rank * segment.num_shards // self.tp_size", "        return rank % segment.num_shards"),
            (
                "                first_rank = -(-shard * self.tp_size // seg.num_shards)",
                "                first_rank = shard",
            ),
        ],
        "tests/test_core_layers.py::test_each_rank_s_slice_is_the_rows_counted_by_hand",
        "heads((4, 2, 2), 2, 4): rank 1 holds rows",
    ),
    m(
        "vocab-loss-sums-unrescaled",
        "vocab-parallel cross entropy sums each rank's exp sum without rescaling it to the global max",
        "shardcore/tensor_parallel/loss.py",
        "combine",
        [("    sum_exp = (sums * (maxes - global_max).exp()).sum(dim=0)", "    sum_exp = sums.sum(dim=0)")],
        "tests/test_core_layers.py::test_vocab_parallel_cross_entropy[2]",
        "vocab-parallel loss",
    ),
    m(
        "vocab-loss-gradient-doubled",
        "the vocab-parallel cross entropy's backward twice too large: every gradient of the model doubled",
        "shardcore/tensor_parallel/loss.py",
        "_VocabParallelCE.backward",
        [
            (
                "        grad.mul_((grad_loss * kept).unsqueeze(-1))",
                "        grad.mul_((2 * grad_loss * kept).unsqueeze(-1))",
            )
        ],
        "tests/integration/test_llama_trainer.py::test_without_clipping_each_gradient_and_the_weights_match_one_process",
        "step 0: gradient norm",
    ),
    m(
        "tensor-parallel-imports-kernels",
        "the fused norms look the kernels up from below them (a package-level import cycle)",
        "shardcore/tensor_parallel/norm.py",
        "_apex_layer_norm",
        [
            (
                "def _apex_layer_norm():\n    try:",
                "def _apex_layer_norm():\n    from ..kernels import flash_attn_available  # noqa: F401\n\n    try:",
            )
        ],
        "tests/test_core_architecture.py::test_no_import_cycle_between_packages",
        "package-level import cycle: tensor_parallel -> kernels -> tensor_parallel",
    ),
    m(
        "vocab-slice-passes-for-whole",
        "F.cross_entropy on a parallel_output slice gives a number (the slice's refusal dropped)",
        "shardcore/tensor_parallel/vocab_slice.py",
        "VocabSlice.__torch_function__",
        [("            if func in _REFUSED and mark is not None:\n", "            if False:\n")],
        "tests/test_core_own_model.py::test_parallel_output_keeps_the_slice_and_refuses_a_whole_logits_loss[2]",
        "'refused': 'no error'",
    ),
    m(
        "moe-experts-output-not-summed",
        "moe_tp_experts without the all-reduce of the experts' partial output",
        "shardcore/tensor_parallel/in_place.py",
        "InPlace.from_native_module",
        [
            (
                "            module.register_forward_pre_hook(enter, with_kwargs=True)\n            module.register_forward_hook(lambda mod, args, out: reduce_from_tp(out, group))\n",
                "            module.register_forward_pre_hook(enter, with_kwargs=True)\n",
            )
        ],
        "tests/test_core_families.py::test_family_exact[deepseek_v3]",
        "deepseek_v3: refused: ShardingCheckError",
    ),
    m(
        "grad-sum-not-summed",
        "a replicated parameter on split activations keeps its rank's partial gradient (no all-reduce)",
        "shardcore/tensor_parallel/grad_sum.py",
        "summed_over.hook",
        [("        return all_reduce(grad.contiguous().clone(), group, where=where)", "        return grad")],
        "tests/test_core_verify.py::test_replicated_parameter_on_split_activations_gets_its_gradient_summed[2]",
        "the gradients of layers.0.alpha, layers.1.alpha differ across the tensor-parallel ranks",
    ),
    m(
        "conv1d-not-transposed",
        "the Conv1D layers take GPT-2's [in, out] weight for an nn.Linear's [out, in]",
        "shardcore/tensor_parallel/conv1d.py",
        "FromConv1D",
        [("    transposed = True", "    transposed = False")],
        "plugins/shard-gpt2/tests/test_gpt2_tp.py::test_conv1d_weights_keep_in_out_layout_split_per_head",
        "expected size 192 along dim 0, got shape (64, 192)",
    ),
    m(
        "frozen-weight-thawed-by-sharding",
        "a parallel layer's slice requires grad whatever the native weight did (LoRA's frozen base trains)",
        "shardcore/tensor_parallel/parallel_module.py",
        "ParallelModule._shard_param",
        [("        grad = full.requires_grad if requires_grad is None else requires_grad", "        grad = True")],
        "tests/integration/test_llama_peft.py::test_lora_matches_unsharded_peft_model[lora-then-optimize-2]",
        "trainable here and frozen in the unsharded PEFT model, or the reverse: ['base_model.model.lm_head.weight'",
    ),
    m(
        "recompute-forgets-the-forward",
        "a recomputed block runs with the live random streams and sequence split, not the forward's",
        "shardcore/tensor_parallel/recompute.py",
        "carry_into_recompute.run",
        [("                stack.enter_context(state.restore(token))", "                pass")],
        "plugins/shard-llama/tests/test_llama_sequence.py::test_gradient_checkpointing_matches_unsharded[split_gather-False]",
        "The size of tensor a (6) must match the size of tensor b (12) at non-singleton dimension 2",
    ),
    m(
        "fused-layernorm-drops-bias",
        "enable_fused_normalization's LayerNorm keeps the weight but drops the native module's bias",
        "shardcore/tensor_parallel/norm.py",
        "FusedLayerNorm.from_native_module",
        [
            (
                "        new.weight, new.bias = module.weight, module.bias",
                "        new.weight, new.bias = module.weight, None",
            )
        ],
        "plugins/shard-bert/tests/test_bert_kernels.py::test_optimization_flags_at_tp2[norm]",
        "missing ['bert.embeddings.LayerNorm.bias'",
    ),
    m(
        "linear-ce-hidden-grad-not-summed",
        "the chunked LM-head loss leaves the hidden states' gradient of this rank's vocabulary slice alone, not "
        "summed over the group",
        "shardcore/tensor_parallel/linear_loss.py",
        "vocab_parallel_linear_cross_entropy",
        [("        hidden = copy_to_tp(hidden, group)", "        hidden = hidden")],
        "tests/test_core_linear_loss.py::test_equals_the_whole_logits_cross_entropy[tp2-bias]",
        "differs from the whole logits' cross entropy",
    ),
    m(
        "linear-ce-padding-logits-counted",
        "the chunked LM-head loss counts the vocabulary padding rows as logits (zero logits in every softmax)",
        "shardcore/tensor_parallel/linear_loss.py",
        "vocab_parallel_linear_cross_entropy",
        [
            (
                '    n_local = getattr(head, "vocab_end", head.weight.shape[0]) - start',
                "    n_local = head.weight.shape[0]",
            )
        ],
        "tests/test_core_linear_loss.py::test_equals_the_whole_logits_cross_entropy[tp4]",
        "differs from the whole logits' cross entropy",
    ),
    m(
        "sac-reduces-kept-matmul-in-place",
        "under a selective checkpoint a row-parallel all-reduce sums into its matmul's output in place, which "
        "the checkpoint keeps for the recompute",
        "shardcore/tensor_parallel/mappings.py",
        "_ReduceFromTP.forward",
        [
            (
                "        if fresh and x.is_contiguous() and not selective_active():",
                "        if fresh and x.is_contiguous():",
            )
        ],
        "tests/integration/test_llama_selective_checkpoint.py::test_selective_checkpointing_matches_unsharded[tp2]",
        "gradient of model.embed_tokens.weight",
    ),
    m(
        "sac-context-unmarked",
        "a selective checkpoint's forward and recompute run unmarked: row-parallel all-reduces sum into the "
        "kept matmul outputs in place",
        "shardcore/tensor_parallel/selective.py",
        "_marked",
        [
            (
                '    _ACTIVE.depth = getattr(_ACTIVE, "depth", 0) + 1',
                '    _ACTIVE.depth = getattr(_ACTIVE, "depth", 0) - 1',
            )
        ],
        "tests/test_core_linear_loss.py::test_a_selective_checkpoint_marks_its_forward_and_recompute",
        "selective_active() in the forward and the recompute",
    ),
    m(
        "shared-copy-issues-no-op",
        "a copy shared by q/k/v (gate/up) returned as it is, with no op of its own: a block that selective "
        "checkpointing recomputes in backward counts its views differently from its forward",
        "shardcore/tensor_parallel/mappings.py",
        "copy_to_tp",
        [("            return _alias(hit[1])  # the ops of a fresh copy: see _alias", "            return hit[1]")],
        "tests/test_core_recent_families.py::test_selective_checkpointing_zero_config[Qwen3]",
        "aten.view.default invocation index 14 encountered during backward but not found in storage",
    ),
    m(
        "compiler-imported-with-shardcore",
        "the eager-only functions of the tensor-parallel regions are marked with torch.compiler.disable at "
        "import: every start imports torch._dynamo (about 3 s of CPU)",
        "shardcore/tensor_parallel/regions.py",
        "",
        [
            (
                '_eager = getattr(torch, "_disable_dynamo", None) or torch.compiler.disable',
                "_eager = torch.compiler.disable",
            )
        ],
        "tests/test_core_plugins.py::test_import_and_discovery_do_not_import_model_libraries",
        "imported by a fresh import of shardcore: torch._dynamo",
    ),
    m(
        "meta-slice-shaped-whole",
        "a paper build's slice (a meta parameter) shaped as the whole tensor: explain's bytes per rank unsplit",
        "shardcore/tensor_parallel/shard_spec.py",
        "ShardSpec.shard",
        [("            shape[self.dim] = self.local_size\n", "")],
        "tests/test_core_zero_config.py::test_explain_predicts_a_zero_config_step",
        "explain says rank 0 holds",
    ),
    m(
        "block-copies-outside-the-checkpoint",
        "a checkpointed block makes its weights' copies in its hook, outside the checkpoint: the recompute makes "
        "them inside, another op sequence than the forward's, which selective checkpointing refuses",
        "shardcore/sequence/split_gather.py",
        "_sum_grads_when_split",
        [
            (
                "module.register_forward_pre_hook(outside if recomputed else enter)",
                "module.register_forward_pre_hook(enter)",
            )
        ],
        "tests/integration/test_llama_selective_checkpoint.py::test_selective_checkpointing_matches_unsharded"
        "[tp2-split_gather]",
        "encountered during backward but not found in storage",
    ),
]
