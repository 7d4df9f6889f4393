"""Mutants of sequence: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import Raised, m

MUTANTS = [
    m(
        "sequence-region-drops-the-last-block",
        "the default split_gather region leaves a model's last block out: it runs on the whole sequence, unsplit",
        "shardcore/sequence/declared.py",
        "regions",
        [("else [policy.blocks()]", "else [policy.blocks()[:-1]]")],
        "tests/test_core_sequence_overlap.py::test_the_sequence_is_split_and_an_odd_length_runs_unsplit",
        "not every block's two regions ran sequence-split",
    ),
    m(
        "sequence-block-input-by-position-whole",
        "a block input handed by position (Gemma 4's per_layer_input) not cut with the hidden states: only "
        "keyword arguments are",
        "shardcore/sequence/ulysses.py",
        "_SplitHooks.split_along",
        [("_positional(module, len(args))", "{}")],
        "tests/test_core_recent_families.py::test_a_blocks_own_input_along_the_sequence_is_cut_with_it[Gemma4-all_to_all]",
        "must match the size of tensor",
    ),
    m(
        "sequence-block-input-any-dimension",
        "a block's own input cut along whichever dimension is as long as the sequence, a width among them, not "
        "refused where it does not run along the hidden states' one",
        "shardcore/sequence/ulysses.py",
        "_laid_out",
        [
            (
                "    if t.dim() > state.dim and t.shape[state.dim] == state.length:\n        return state.dim",
                "    return _along(t, state, key)",
            )
        ],
        "tests/test_core_recent_families.py::test_a_sequence_split_the_attention_cannot_follow_is_refused_by_name"
        "[a-block-input-not-along-the-sequence-all_to_all]",
        "The size of tensor a (16) must match the size of tensor b (8)",  # the width cut as if the sequence
    ),
    m(
        "sp-replicated-grads-not-summed",
        "split_gather: replicated parameters' gradients (norms) not summed over the sequence split",
        "shardcore/sequence/split_gather.py",
        "apply_sequence_parallel",
        [
            (
                "                if partial:\n                    owners.append((module, partial))",
                "                if False:\n                    owners.append((module, partial))",
            )
        ],
        "plugins/shard-llama/tests/test_llama_sequence.py::test_split_gather_matches_unsharded[causal-tp2]",
        "gradient of model.layers.0.input_layernorm.weight (gathered): relative error",
    ),
    m(
        "ulysses-backward-swapped",
        "Ulysses: the backward exchange with scatter and gather swapped (reshaped to fit, as one silences autograd's shape check)",
        "shardcore/sequence/ulysses.py",
        "_AllToAll",
        [
            (
                "        ctx.group, ctx.scatter, ctx.gather = group, scatter, gather\n",
                "        ctx.group, ctx.scatter, ctx.gather, ctx.shape = group, scatter, gather, x.shape\n",
            ),
            (
                '            all_to_all_cat(grad, ctx.group, ctx.gather, ctx.scatter, where="backward of Ulysses attention"),',
                "            all_to_all_cat(grad, ctx.group, ctx.scatter, ctx.gather).reshape(ctx.shape),",
            ),
        ],
        "plugins/shard-llama/tests/test_llama_sequence.py::test_all_to_all_matches_unsharded[seqcls-gqa-sp2]",
        "gradient of model.embed_tokens.weight (gathered): relative error",
    ),
    m(
        "ring-mask-offset",
        "ring_attn: every rank masks its queries as if it held the first chunks (mask offset lost)",
        "shardcore/sequence/ring.py",
        "ring_attention.attention",
        [("        mine = positions[group_rank(group)]", "        mine = positions[0]")],
        "plugins/shard-llama/tests/test_llama_sequence.py::test_ring_attn_matches_unsharded[gqa-padded-sp2]",
        "output 'logits': max abs diff",
    ),
    m(
        "sp-swaps-registered-parameters",
        "sequence parallelism puts the gradient-summing copy of a norm weight into the parameter registry mid-forward",
        "shardcore/sequence/split_gather.py",
        "_sum_grads_when_split.enter",
        [
            (
                "                        owner.__dict__[n] = _TokenSum.apply(",
                "                        owner._parameters[n] = _TokenSum.apply(",
            )
        ],
        "plugins/shard-llama/tests/test_llama_sequence.py::test_a_split_forward_never_swaps_registered_parameters",
        "_registry_mid_forward failed",
    ),
    m(
        "sp-shadows-own-parameters-only",
        "a sequence split sums a block parameter's gradient only when its own module runs: a parent reading a "
        "child's weight (LongCat-Flash's router) leaves it this rank's share",
        "shardcore/sequence/split_gather.py",
        "_token_sums",
        [
            (
                "        inside = {id(m) for m in module.modules()}",
                "        inside = {id(module)}",
            )
        ],
        "tests/test_core_recent_families.py::"
        "test_a_parent_reading_a_childs_weight_and_experts_a_rank_may_not_reach_under_ulysses",
        "gradient of model.layers.0.mlp.router.classifier.weight (gathered): relative error",
    ),
    m(
        "sp-copies-unanchored",
        "a sequence split's gradient-summing copies follow this rank's tokens only: a rank none of whose tokens "
        "reached an expert skips its sum, the other waits in it",
        "shardcore/sequence/split_gather.py",
        "_sum_grads_when_split.leave",
        [("        return _anchored(output, copies)", "        return None")],
        "tests/test_core_recent_families.py::"
        "test_a_parent_reading_a_childs_weight_and_experts_a_rank_may_not_reach_under_ulysses",
        "waited more than 60 s for the other ranks",  # its ShardConfig(collective_timeout=60)
    ),
    m(
        "sp-unreached-gets-zeros",
        "a block parameter no rank's tokens reached gets a zero gradient under a sequence split, not None "
        "(AdamW then moves it by its weight decay, which the unsharded model never does)",
        "shardcore/sequence/split_gather.py",
        "_TokenSum.backward",
        [("        if grad is None and flat[-1].item() == 0:", "        if grad is None and flat[-1].item() < 0:")],
        "tests/test_core_recent_families.py::"
        "test_a_parent_reading_a_childs_weight_and_experts_a_rank_may_not_reach_under_ulysses",
        "sharded set, unsharded None",
    ),
    m(
        "ring-merge-not-rescaled",
        "ring attention adds each block's output without rescaling the running result to the new log-sum-exp",
        "shardcore/sequence/blocks.py",
        "merge",
        [
            (
                "    out[:, :, rows] = now_out * torch.exp(now_lse - safe).unsqueeze(-1) + piece_out",
                "    out[:, :, rows] = now_out + piece_out",
            )
        ],
        "tests/test_core_ring.py::test_ring_attention_equals_full_attention[causal-2-fused]",
        "ring attention differs from full attention",
    ),
    m(
        "ring-diagonal-chunk-unmasked",
        "ring attention: a query chunk sees its own key chunk whole, later tokens included (causal flag lost)",
        "shardcore/sequence/blocks.py",
        "pieces",
        [("(j + 1) * half), None, theirs == mine)", "(j + 1) * half), None, False)")],
        "tests/test_core_ring.py::test_ring_attention_equals_full_attention[zigzag-4-fused]",
        "ring attention differs from full attention",
    ),
    m(
        "ring-masked-row-counted",
        "ring attention: a row that sees no key of a block keeps the fused kernel's log-sum-exp (0, not -inf)",
        "shardcore/sequence/blocks.py",
        "attend",
        [('        lse = lse.masked_fill(_sees_nothing(piece.mask), float("-inf"))', "        pass")],
        "tests/test_core_ring.py::test_ring_attention_equals_full_attention[padded-2-fused]",
        "ring attention differs from full attention",
    ),
    m(
        "ring-gradients-not-home",
        "ring attention's key/value gradients stop one hop short of their owner (the last shift skipped)",
        "shardcore/sequence/ring.py",
        "_RingAttention.backward",
        [
            ("        for step in range(world):\n", "        for step in range(world):\n"),
            (
                "            if world > 1:  # after the last step the block goes home with every rank's gradients",
                "            if world > 1 and step < world - 1:",
            ),
        ],
        "tests/test_core_ring.py::test_ring_attention_equals_full_attention[padded-4-math]",
        "ring shifts (3, 3)",
    ),
    m(
        "sp-unsupported-mode-accepted",
        "a sequence-parallel mode the policy does not support is not refused before sharding",
        "shardcore/sequence/check.py",
        "check_sequence_parallel",
        [("    if mode not in supported:", "    if False:")],
        "plugins/shard-t5/tests/test_t5_tp.py::test_sequence_parallelism_refused_by_name[sequence]",
        "T5ForConditionalGeneration does not run its attention through transformers' attention registry",
    ),
    m(
        "spec-sequence-regions-ignored",
        "split_gather splits over every block, ignoring the regions the spec declares (Whisper's decoder split)",
        "shardcore/sequence/declared.py",
        "regions",
        [
            (
                "    return [list(r) for r in found] if found is not None else [policy.blocks()]",
                "    return [policy.blocks()]",
            )
        ],
        "tests/test_core_spec.py::test_a_sequence_spec_is_read_with_its_defaults",
        "not the declared [['blocks.0']]",
        fast=True,
    ),
    m(
        "ring-bidirectional-split-zigzag",
        "a bidirectional model's ring splits in zigzag chunks as a causal one's: ViT's 10 tokens (not divisible "
        "by 2 x sp) run unsplit",
        "shardcore/sequence/ulysses.py",
        "apply_ulysses",
        [("    state.zigzag = spec.causal", "    state.zigzag = True")],
        "plugins/shard-vit/tests/test_vit_sequence.py::test_hf_sequence_parallel_matches_unsharded[vit-ring_attn-sp2]",
        "the tokens were not split",
    ),
    m(
        "ring-contiguous-positions-zigzag",
        "the ring takes a contiguous split's tokens at zigzag positions: the padding mask lands on the wrong keys",
        "shardcore/sequence/ring.py",
        "ring_positions",
        [
            (
                "    return zigzag_positions(length, size) if zigzag else",
                "    return zigzag_positions(length, size) if True else",
            )
        ],
        "plugins/shard-bert/tests/test_bert_sequence.py::test_over_the_sp_dim_matches_unsharded[ring-mlm-padded-sp4]",
        "output 'logits': max abs diff",
    ),
    m(
        "ulysses-regions-ignored",
        "Ulysses and the ring split every block as one run, ignoring the spec's regions: Whisper's decoder "
        "reads the encoder's frames still split",
        "shardcore/sequence/ulysses.py",
        "apply_ulysses",
        [("    for region in regions(policy):", "    for region in [policy.blocks()]:")],
        "plugins/shard-whisper/tests/test_whisper_sequence.py::test_over_the_sp_dim_matches_unsharded[ulysses-sp2]",
        "Expected input batch_size",
    ),
    m(
        "sequence-routed-ignored",
        "a policy's word that its attention reads the registry (SequenceSpec.routed) is ignored: Whisper's "
        "Ulysses and ring refused though they run",
        "shardcore/integrations/hf/attention.py",
        "ulysses_problem",
        [("    if not routed and not getattr(model,", "    if not getattr(model,")],
        "plugins/shard-whisper/tests/test_whisper_sequence.py::test_over_the_sp_dim_matches_unsharded[ring-sp2]",
        Raised("NotImplementedError", "shardcore/sequence/check.py::_check_over_sp"),
    ),
    m(
        "ring-fused-for-narrower-values",
        "the ring's pieces run the fused CPU kernel whatever the values' width (MLA's values narrower than its keys)",
        "shardcore/sequence/blocks.py",
        "_fused",
        [(" and k.shape[-1] == v.shape[-1]", "")],
        "tests/test_core_recent_families.py::test_sequence_parallelism_through_the_attention_registry"
        "[DeepseekV3-ring_attn]",
        "should have the same head size",
    ),
    m(
        "ring-values-as-wide-as-keys",
        "the ring's running output made as wide as the queries, not the values",
        "shardcore/sequence/ring.py",
        "_RingAttention.forward",
        [("        out = torch.zeros((*q.shape[:-1], v.shape[-1]),", "        out = torch.zeros(q.shape,")],
        "tests/test_core_recent_families.py::test_sequence_parallelism_through_the_attention_registry"
        "[DeepseekV3-ring_attn]",
        "must match the size of tensor",
    ),
    m(
        "ulysses-per-head-first-slice",
        "under Ulysses every rank given the first rank's heads' slice of a per-head value (attention sinks)",
        "shardcore/sequence/ulysses.py",
        "_heads_of",
        [("        return t.chunk(size)[rank]", "        return t.chunk(size)[0]")],
        "tests/test_core_recent_families.py::test_sequence_parallelism_through_the_attention_registry"
        "[GptOss-all_to_all]",
        "output 'logits': max abs diff",
    ),
    m(
        "sequence-eager-not-found",
        "a model built with eager attention: its modeling module's own eager function not looked up, the split refused",
        "shardcore/integrations/hf/attention.py",
        "_own_eager",
        [("    if fallback is None:\n        return None", "    return None")],
        "tests/test_core_recent_families.py::test_sequence_parallelism_through_the_attention_registry"
        "[GptOss-ring_attn]",
        "defines no eager_attention_forward",
    ),
    m(
        "sequence-refused-reason-dropped",
        "a policy's per-mode refusal reason (SequenceSpec.refused) not given: the user reads only which modes "
        "are supported",
        "shardcore/sequence/check.py",
        "check_sequence_parallel",
        [("    why = spec.refused.get(", "    why = None and spec.refused.get(")],
        "tests/test_core_recent_families.py::test_a_sequence_split_the_attention_cannot_follow_is_refused_by_name"
        "[its-own-use-of-the-mask-ring_attn]",
        "not refused as expected",
    ),
    m(
        "sequence-split-stacked-streams",
        "hidden states with as many streams stacked before the sequence as tokens (which dimension is the "
        "sequence: not one answer) split along dim 1 all the same",
        "shardcore/sequence/check.py",
        "refuse_stacked",
        [("    if x.dim() != 3:", "    if False:")],
        "tests/test_core_recent_families.py::test_a_sequence_split_the_attention_cannot_follow_is_refused_by_name"
        "[stacked-streams-all_to_all]",
        "runs along the sequence of 2 tokens on no one dimension",
    ),
    m(
        "split-sums-summed-again",
        "under split_gather a replicated parameter the policy already sums over the group (a per-head norm inside "
        "the region) summed again for the split",
        "shardcore/sequence/split_gather.py",
        "apply_sequence_parallel",
        [(" and id(p) not in summed", "")],
        "tests/test_core_recent_families.py::test_split_gather_over_the_region_the_plan_gives[Qwen3]",
        "gradient of model.layers.0.self_attn.q_norm.weight (gathered): relative error 1",
    ),
    m(
        "gathered-mixer-run-on-a-part",
        "Qwen3-Next's Gated DeltaNet run on a rank's part of the sequence under Ulysses (its input not gathered, "
        "its output not cut)",
        "shardcore/sequence/gathered.py",
        "install_gathered",
        [("    for name, module in modules:", "    for name, module in []:")],
        "tests/test_core_recent_families.py::test_hybrids_and_per_position_scales_under_ulysses_and_the_ring"
        "[Qwen3Next-all_to_all]",
        "2 blocks ran but the split attention ran 1 times",
    ),
    m(
        "gathered-input-gradient-dropped",
        "a gathered mixer's input gradient not reduce-scattered back to the ranks' parts (dropped)",
        "shardcore/sequence/gathered.py",
        "_whole",
        [("    full = gather_seq(t, state.group, dim)", "    full = gather_seq(t.detach(), state.group, dim)")],
        "tests/test_core_recent_families.py::test_hybrids_and_per_position_scales_under_ulysses_and_the_ring"
        "[Qwen3Next-all_to_all]",
        "gradient of model.embed_tokens.weight (gathered): relative error",
    ),
    m(
        "gathered-output-cut-in-order-under-the-ring",
        "a gathered mixer's output cut back in contiguous parts where the ring holds zigzag chunks",
        "shardcore/sequence/gathered.py",
        "_part",
        [("    t = _zigzag(t, state.size, dim) if zigzagged(state) else t", "    t = t")],
        "tests/test_core_recent_families.py::test_hybrids_and_per_position_scales_under_ulysses_and_the_ring"
        "[FalconH1-ring_attn]",
        "output 'logits': max abs diff",
    ),
    m(
        "unmixed-blocks-expected-to-attend",
        "Nemotron-H's MLP-only layer (no token mixing) expected to run a split attention: the model refused at "
        "its first step",
        "shardcore/sequence/ulysses.py",
        "_SplitHooks.enter",
        [("        if self.state.active and self.names[index] not in self.unmixed:", "        if self.state.active:")],
        "tests/test_core_recent_families.py::test_hybrids_and_per_position_scales_under_ulysses_and_the_ring"
        "[NemotronH-all_to_all]",
        "3 blocks ran but the split attention ran 2 times",
    ),
    m(
        "split-kwarg-along-the-hidden-states-dim",
        "Beam's per-position query scale (batch, 1, sequence, 1) cut along the hidden states' dim 1",
        "shardcore/sequence/gathered.py",
        "sequence_dim",
        [("    return dims[0] if len(dims) == 1 else None", "    return state.dim")],
        "tests/test_core_recent_families.py::test_hybrids_and_per_position_scales_under_ulysses_and_the_ring"
        "[Beam-ring_attn]",
        "tuple index out of range",  # its sequence dim of size 1 cut in two
    ),
    m(
        "cached-keys-read-in-a-split-forward",
        "Dory's layer run twice in one training forward, its second run reading the keys its first wrote to the "
        "KV cache (a rank's part of them under the split), attended to all the same",
        "shardcore/sequence/check.py",
        "refuse_cached_keys",
        [("    if key.shape[2] != query.shape[2]:", "    if False:")],
        "tests/test_core_recent_families.py::test_layers_run_twice_in_a_forward_with_a_cache[all_to_all]",
        "AssertionError: no error",  # attended to (a rank's part of the cached keys), not refused
    ),
    m(
        "sequence-stacked-streams-cut-along-the-batch",
        "Gemma 3n's hidden states, 4 streams stacked before the sequence, split along dim 1 (the batch) as a "
        "(batch, sequence, hidden) tensor would be",
        "shardcore/sequence/check.py",
        "stacked_dim",
        [("        return 2\n", "        return state.dim\n")],
        "tests/test_core_recent_families.py::test_a_blocks_own_input_along_the_sequence_is_cut_with_it[Gemma3n-all_to_all]",
        "runs along the sequence of 2 tokens on no one dimension",  # the batch of 2 read as the sequence
    ),
    m(
        "sequence-block-shadows-nothing",
        "the block's own hooks shadow none of its subtree's weights: one a method of a child reads (Gemma 3n's AltUp "
        "correct_output_scale), not through the child's forward, keeps each rank's own tokens' gradient",
        "shardcore/sequence/split_gather.py",
        "_token_sums",
        [("        if mine:\n", "        if mine and module is not block:\n")],
        "tests/test_core_recent_families.py::test_a_blocks_own_input_along_the_sequence_is_cut_with_it[Gemma3n-ring_attn]",
        "gradient of model.layers.0.altup.correct_output_scale (gathered): relative error",
    ),
    m(
        "recompute-without-the-blocks-hooks",
        "a block's forward recomputed by a checkpoint without the hooks the block keeps for it: a weight the block "
        "reads in a method (Gemma 3n's AltUp correct_output_scale) keeps each rank's tokens' gradient under the "
        "reentrant checkpoint",
        "shardcore/tensor_parallel/recompute.py",
        "_rerun",
        [('getattr(owner, "__dict__", {}).get("_shardcore_recompute")', "None")],
        "tests/test_core_recent_families.py::test_a_weight_a_block_reads_in_a_method_under_checkpointing[reentrant]",
        "gradient of model.layers.0.altup.correct_output_scale (gathered): relative error",
    ),
    m(
        "positional-past-star-args",
        "a block's positional arguments named past its *args: one caught by *args taken for the keyword-only "
        "parameter of that name",
        "shardcore/sequence/ulysses.py",
        "_parameters",
        [("itertools.takewhile(lambda p: p.kind in positional, params)", "params")],
        "tests/test_core_recent_families.py::test_a_blocks_positional_arguments_are_named_up_to_its_star_args",
        "named past *args",
    ),
    m(
        "ring-mask-gradient-dropped",
        "the ring's own kernel runs a mask with a gradient (Doge's dynamic mask), which it holds constant: the "
        "weights that make the mask get none from the attention",
        "shardcore/sequence/ring.py",
        "ring_attention",
        [("and attention_mask.requires_grad:", "and attention_mask.requires_grad and False:")],
        "tests/test_core_recent_families.py::"
        "test_a_mask_the_attention_module_builds_itself_is_built_over_the_whole_sequence[ring_attn]",
        "gradient of model.embed_tokens.weight (gathered): relative error",
    ),
    m(
        "ulysses-mask-heads-whole",
        "Ulysses hands the attention function a mask with one slice a head for every head, not the rank's",
        "shardcore/sequence/ulysses.py",
        "ulysses_attention",
        [("attention_mask.dim() == 4 and attention_mask.shape[1] > 1:", "attention_mask.dim() == 4 and False:")],
        "tests/test_core_recent_families.py::"
        "test_a_mask_the_attention_module_builds_itself_is_built_over_the_whole_sequence[all_to_all]",
        "The size of tensor a (2) must match the size of tensor b (4) at non-singleton dimension 1",
    ),
    m(
        "whole-mask-on-a-ranks-keys",
        "an attention module's own mask builder runs on a rank's part of the sequence beside the whole mask",
        "shardcore/sequence/gathered.py",
        "_whole_mask",
        [("        if not dims:\n            return t", "        if True:\n            return t")],
        "tests/test_core_recent_families.py::"
        "test_a_mask_the_attention_module_builds_itself_is_built_over_the_whole_sequence[all_to_all]",
        "The size of tensor a (16) must match the size of tensor b (8) at non-singleton dimension 2",
    ),
    m(
        "mask-builder-unseen",
        "an attention module's own mask builder (Doge's prepare_dynamic_mask) not read from its forward: the "
        "model refused as if it read the whole mask beside a rank's queries",
        "shardcore/integrations/hf/masks.py",
        "_builder",
        [("    return built.get(handed) if handed else None", "    return None")],
        "tests/test_core_recent_families.py::"
        "test_a_mask_the_attention_module_builds_itself_is_built_over_the_whole_sequence[all_to_all]",
        "DogeAttention uses the attention mask besides handing it to the attention function",
    ),
    m(
        "ring-ignores-sliding-window",
        "the ring takes the causal rule at the queries' and keys' positions in place of the model's mask: a "
        "sliding layer sees every earlier key",
        "shardcore/sequence/ring.py",
        "_mask_at",
        [('    if mask is None and getattr(module, "is_causal", True):', '    if getattr(module, "is_causal", True):')],
        "tests/test_core_recent_families.py::test_sequence_parallelism_through_the_attention_registry[Gemma3-ring_attn]",
        "output 'logits': max abs diff",
    ),
    m(
        "ulysses-mask-heads-cut-whatever-their-count",
        "Ulysses cuts a mask's dim 1 into the rank's part whatever it holds, not only the query or key/value heads",
        "shardcore/sequence/check.py",
        "mask_heads",
        [("    if mask.shape[1] not in (query_heads, kv_heads):", "    if False:")],
        "tests/test_core_recent_families.py::"
        "test_a_mask_with_a_slice_a_head_is_cut_only_where_its_slices_are_the_heads",
        "DID NOT RAISE NotImplementedError",
    ),
    m(
        "mask-builder-gathers-what-it-reads-for-shape",
        "an attention module's mask builder gets every argument along the sequence gathered, those it reads only for "
        "their length and dtype too (Doge's hidden states: an all-gather a layer for nothing)",
        "shardcore/sequence/gathered.py",
        "_whole_mask",
        [("        if key in shaped:", "        if False:")],
        "tests/test_core_recent_families.py::"
        "test_a_mask_the_attention_module_builds_itself_is_built_over_the_whole_sequence[all_to_all]",
        "all-gathers in a forward: 6",
    ),
]
