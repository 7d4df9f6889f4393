"""The families people train in 2026 with no plugin (Qwen3, Gemma 3, OLMo-2, DeepSeek-V3, ...), sharded
zero-config, through the user's own lines: each compared with the unsharded model (outputs, loss, every
gradient, 3 AdamW steps)."""

from __future__ import annotations

import functools

import pytest
import torch
from recent_models import COMMON, LAYERS, batch, build, config

from shardcore import ShardConfig
from shardcore.testing import assert_sharded_matches, run_on_ranks

TP2 = ShardConfig(tensor_parallel_size=2)


def _selective(family: str) -> dict:
    import shardcore

    decided = {"save": 0, "recompute": 0}

    def checkpointed():
        model = build(family)
        kwargs = {"use_reentrant": False, "context_fn": shardcore.selective_checkpoint_context(counts=decided)}
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        return model

    return assert_sharded_matches(checkpointed, batch(), ShardConfig(tensor_parallel_size=2)) | decided


@pytest.mark.parametrize("family", ["Qwen3", "Gemma3", "Olmo2", "DeepseekV3"])
def test_selective_checkpointing_zero_config(family):
    """The model's own gradient_checkpointing_enable with shardcore's selective context at TP=2: the
    q/k norms' views and the shared copies of q/k/v's input recomputed as their forward ran them."""
    for report in run_on_ranks(2, _selective, family):
        assert "max_abs_diff_after_steps" in report, report
        assert report["save"] > 0 and report["recompute"] > 0, report


def _fsdp(family: str) -> dict:
    import torch.distributed.fsdp as fsdp

    import shardcore

    report = assert_sharded_matches(
        lambda: build(family), batch(), ShardConfig(tensor_parallel_size=1, data_parallel="fsdp")
    )
    model = shardcore.optimize(build(family), ShardConfig(tensor_parallel_size=1, data_parallel="fsdp"))
    wrapped = [n for n, m in model.named_modules() if isinstance(m, fsdp.FSDPModule)]
    return report | {"wrapped": wrapped}


def test_fsdp_finds_the_blocks_of_a_plan_that_names_only_the_ends():
    """GPT-OSS's plan names only its embedding and head: FSDP still shards each decoder layer."""
    for report in run_on_ranks(2, _fsdp, "GptOss"):
        assert "max_abs_diff_after_steps" in report, report
        assert {"model.layers.0", "model.layers.1"} <= set(report["wrapped"]), report["wrapped"]


def _lazy(family: str, checkpoint: str) -> dict:
    """Load the per-expert checkpoint onto the meta-built model at TP=2; the expert bytes read, counted."""
    from shardcore.testing import assert_lazy_load_matches, rows_read

    with rows_read() as read:
        worst = assert_lazy_load_matches(lambda: build(family), {"input_ids": batch()["input_ids"]}, checkpoint, TP2)
    return {"worst": worst, "expert_bytes": sum(n for key, n in read if ".experts." in key)}


@pytest.mark.parametrize("family", ["DeepseekV3", "Qwen3Moe"])
def test_a_hub_layout_moe_checkpoint_is_read_on_shard(family, tmp_path):
    """DeepSeek-V3 and Qwen3-MoE as save_pretrained writes them (and the Hub holds them): each expert's
    gate, up and down projections apart, fused by transformers' own conversion mapping on reading. At TP=2
    (the plan splits the fused gate_up packed by columns, down_proj by rows) each rank reads half of every
    expert's bytes: a slice of the gate's rows and of the up projection's, half of down_proj's columns."""
    import torch

    torch.manual_seed(0)
    model = build(family)
    model.save_pretrained(tmp_path)
    written = set()
    for path in tmp_path.glob("*.safetensors"):
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            written |= set(f.keys())
    assert any(".experts.0.gate_proj.weight" in k for k in written), sorted(written)[:8]  # the per-expert layout
    total = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n)
    for report in run_on_ranks(2, _lazy, family, str(tmp_path)):
        assert report["expert_bytes"] == total // 2, (report, total)


def _pipeline(family: str, config: dict, layers: int) -> dict:
    from shardcore.testing.pipeline import assert_pipeline_matches

    rows = 4 if config.get("pipeline_schedule") == "Interleaved1F1B" else 2  # its 4 microbatches
    return assert_pipeline_matches(lambda: build(family, layers), batch(rows=rows), ShardConfig(**config))


@pytest.mark.parametrize("family", ["Qwen3", "Gemma3", "Olmo2", "DeepseekV3"])
def test_pipeline_from_the_plan_the_config_ships(family):
    """PP=2 (1F1B) cut where the config's base_model_pp_plan says: the embedding on the first stage,
    the final norm and the head on the last, the model's own forward on each stage's layers (Gemma 3's
    sliding layer stays sliding, DeepSeek-V3's MoE layer routes its tokens): loss, every gradient and
    3 AdamW steps equal to the unsharded model's."""
    config = {"pipeline_parallel_size": 2, "tensor_parallel_size": 1}
    for report in run_on_ranks(2, _pipeline, family, config, 2):
        assert "max_abs_diff_after_steps" in report, report


@pytest.mark.parametrize("family", ["Qwen3", "Gemma3", "Olmo2"])
def test_pipeline_from_the_shipped_plan_with_tensor_parallelism(family):
    """PP=2 x TP=2 on 4 ranks, the shipped TP plan inside each stage; and Interleaved1F1B over 4 layers
    (two stages a rank, Gemma 3's sliding and full layers alternating across them)."""
    pp_tp = {"pipeline_parallel_size": 2, "tensor_parallel_size": 2}
    for report in run_on_ranks(4, _pipeline, family, pp_tp, 2):
        assert "max_abs_diff_after_steps" in report, report
    interleaved = {"pipeline_parallel_size": 2, "tensor_parallel_size": 1, "pipeline_schedule": "Interleaved1F1B"}
    for report in run_on_ranks(2, _pipeline, family, interleaved, 4):
        assert "max_abs_diff_after_steps" in report, report


def _codegen():
    import transformers

    config = transformers.CodeGenConfig(
        vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_inner=128
    )
    return transformers.CodeGenForCausalLM(config).float()


def _codegen_pipeline() -> dict:
    from shardcore.testing.pipeline import assert_pipeline_matches

    return assert_pipeline_matches(_codegen, batch(), ShardConfig(pipeline_parallel_size=2, tensor_parallel_size=1))


def test_a_stage_that_indexes_a_table_with_its_inputs():
    """CodeGen's blocks index a table of sines with the position ids the stage receives. torch runs
    every stage once on tensors made from the shapes it receives before the first microbatch; left
    uninitialised, the last stage indexed out of range there and the first waited for it. At PP=2:
    exact."""
    for report in run_on_ranks(2, _codegen_pipeline):
        assert "max_abs_diff_after_steps" in report, report


def _diff_llama():
    import transformers

    config = transformers.DiffLlamaConfig(**COMMON)  # a TP plan shipped, no pipeline plan
    return transformers.DiffLlamaForCausalLM(config)


def _glm_moe_dsa():
    import transformers

    own = {"moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1}
    own |= {"kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8}
    own |= {"num_key_value_heads": 4, "index_topk": 8, "index_head_dim": 16, "index_n_heads": 2, "head_dim": 16}
    own |= {"mlp_layer_types": ["dense", "sparse"], "first_k_dense_replace": 1}
    return transformers.GlmMoeDsaForCausalLM(transformers.GlmMoeDsaConfig(**COMMON | own))


def _qwen3_classifier():
    import transformers

    return transformers.Qwen3ForSequenceClassification(config("Qwen3"))


def _qwen3_pp_plan(changed: dict):
    model = build("Qwen3")
    plan = dict(model.config.base_model_pp_plan) | changed
    model.config.base_model_pp_plan = {k: v for k, v in plan.items() if v is not None}
    return model


def _qwen3_with_pp_plan(**changed):
    return functools.partial(_qwen3_pp_plan, changed)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            _qwen3_with_pp_plan(layers=(["hidden_states", "encoder_hidden_states"], ["hidden_states"])),
            r"its blocks take \['encoder_hidden_states'\], which no stage builds",
        ),
        (_qwen3_with_pp_plan(norm=None), r"\['norm'\] hold parameters and are on no stage of it"),
        (_diff_llama, r"DiffLlamaConfig's base_model_pp_plan: none ships .*; write a plugin with its stages"),
        (_qwen3_classifier, r"built for a \*ForCausalLM with an lm_head, not Qwen3ForSequenceClassification"),
        (_glm_moe_dsa, r"its blocks hand \['topk_indices'\] on to the next block besides the hidden states"),
    ],
    ids=[
        "an-input-no-stage-builds",
        "a-module-on-no-stage",
        "no-pipeline-plan",
        "not-a-causal-lm",
        "a-handed-on-output",
    ],
)
def test_a_pipeline_the_shipped_plan_cannot_give_is_refused_by_name(make, message):
    """Refused at optimize, on every rank alike, before any collective: the config class and what is missing."""
    import re

    from shardcore.testing.refusals import refusal_message

    layout = ShardConfig(pipeline_parallel_size=2, tensor_parallel_size=1)
    for said in run_on_ranks(2, refusal_message, make, layout):
        assert re.search(message, said), f"not refused as expected; optimize said: {said}"
        assert "does not support pipeline parallelism" in said, said


def _sp2(mode: str) -> ShardConfig:
    """SP=2 in ``mode`` over the 2 ranks."""
    return ShardConfig(
        tensor_parallel_size=1,
        sequence_parallel_size=2,
        enable_sequence_parallelism=True,
        sequence_parallelism_mode=mode,
    )


def _sequence(family: str, mode: str) -> dict:
    return assert_sharded_matches(lambda: build(family), batch(seq=16), _sp2(mode))


@pytest.mark.parametrize("mode", ["all_to_all", "ring_attn"])
@pytest.mark.parametrize("family", ["Qwen3", "Gemma3", "Olmo2", "DeepseekV3", "GptOss"])
def test_sequence_parallelism_through_the_attention_registry(family, mode):
    """SP=2 under Ulysses and the ring: the model's attention switched in transformers' registry, the
    rotary embeddings split with the hidden states (Gemma 3's sliding layer, window 4 of 16 tokens, over
    gathered keys and values in the ring); the kit checks the all-to-alls / ring shifts ran. DeepSeek-V3's
    values are narrower than its keys (MLA); GPT-OSS runs its own eager attention, its per-head sinks cut
    to each rank's heads under Ulysses (gathered keys and values in the ring)."""
    for report in run_on_ranks(2, _sequence, family, mode):
        assert "max_abs_diff_after_steps" in report, report


def _hybrid(family: str, mode: str) -> dict:
    from shardcore.tensor_parallel import count_collectives

    layers = 3 if family == "NemotronH" else 2
    with count_collectives() as counts:
        report = assert_sharded_matches(lambda: build(family, layers), batch(seq=16), _sp2(mode))
    return report | {"all_gather": counts.get("all_gather", 0), "reduce_scatter": counts.get("reduce_scatter", 0)}


@pytest.mark.parametrize("mode", ["all_to_all", "ring_attn"])
@pytest.mark.parametrize("family", ["MiniMax", "Qwen3Next", "FalconH1", "NemotronH", "Ministral3", "Beam"])
def test_hybrids_and_per_position_scales_under_ulysses_and_the_ring(family, mode):
    """SP=2: a hybrid's token mixers outside the attention (MiniMax's lightning attention, Qwen3-Next's
    Gated DeltaNet, Falcon-H1's Mamba-2 beside the attention in one layer, Nemotron-H's Mamba-2 with a layer
    of an MLP alone) run over the whole sequence (gathered, then cut back: the kit's comparison of every
    gradient holds the reduce-scatter to account), the attention layers split; Ministral 3's
    per-position query scale cut with the hidden states (its position_ids given whole to the attention
    function), and Beam's, a ``(batch, 1, sequence, 1)`` tensor cut along its own sequence dimension."""
    for report in run_on_ranks(2, _hybrid, family, mode):
        assert "max_abs_diff_after_steps" in report, report
        if family not in (
            "Ministral3",
            "Beam",
        ):  # each mixer's input gathered in the forward, its gradient reduce-scattered
            assert report["all_gather"] > 0 and report["reduce_scatter"] > 0, report


def _looped(mode: str, layers: int, use_cache: bool) -> str | dict:
    config = ShardConfig(sequence_parallel_size=2, enable_sequence_parallelism=True, sequence_parallelism_mode=mode)
    if layers == 1 and use_cache:  # its one layer run twice, the second run reading the first's keys from the cache
        return _refused_in_a_step(lambda: build("Dory", 1), config)
    return assert_sharded_matches(lambda: build("Dory", layers), batch(seq=16) | {"use_cache": use_cache}, config)


@pytest.mark.parametrize("mode", ["all_to_all", "ring_attn"])
def test_layers_run_twice_in_a_forward_with_a_cache(mode):
    """Dory loops over its layers, with the KV cache transformers makes in training. Its middle layer run
    twice (3 layers: each loop writes its own copy of the cache) is exact under the split. A layer whose
    second run reads the keys its first wrote (1 layer, run as the input and the output layer: its
    attention sees 32 keys for 16 queries), a rank's part of them under the split, is refused by name at
    the first step, the same on every rank; with ``use_cache=False`` exact."""
    for report in run_on_ranks(2, _looped, mode, 3, True):
        assert "max_abs_diff_after_steps" in report, report
    for said in run_on_ranks(2, _looped, mode, 1, True):
        assert "attends 8 queries of this rank to 16 keys: keys read from a KV cache" in said, said
    for report in run_on_ranks(2, _looped, mode, 1, False):
        assert "max_abs_diff_after_steps" in report, report


@pytest.mark.parametrize("mode", ["all_to_all", "ring_attn"])
def test_a_hybrid_in_pipeline_stages_with_its_sequence_split(mode):
    """Qwen3-Next at PP=2 x SP=2 (4 ranks): its Gated DeltaNet layer on the first stage runs over the whole
    sequence there, the attention layer on the second splits it; each stage hooks only the mixers of the
    blocks it holds (the other stage's are holes)."""
    config = {"pipeline_parallel_size": 2, "tensor_parallel_size": 1, "sequence_parallel_size": 2}
    config |= {"enable_sequence_parallelism": True, "sequence_parallelism_mode": mode}
    for report in run_on_ranks(4, _pipeline, "Qwen3Next", config, 2):
        assert "max_abs_diff_after_steps" in report, report


_MARK = 5  # a token id whose embedding alone points along dimension 0, which the first router reads


def _longcat_built():
    model = build("LongcatFlash")
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 0.0
        model.model.embed_tokens.weight[_MARK, 0] = 10.0
        first = model.model.layers[0].mlp.router  # the first layer's routed expert 0: the marked tokens only
        first.classifier.weight[:4] = 0.0
        first.classifier.weight[0, 0] = 5.0
        first.e_score_correction_bias[:4] = -0.9
        # the last layer's routed experts below every zero-computation one (scores are softmax
        # probabilities): no token reaches them, their gradient is None, as unsharded
        model.model.layers[-1].mlp.router.e_score_correction_bias[:4] = -1.0
    return model


def _longcat_ids() -> torch.Tensor:
    ids = batch(seq=16)["input_ids"]
    ids[ids == _MARK] = _MARK + 1
    return ids


def _longcat() -> dict:
    ids = _longcat_ids()
    ids[:, 2] = _MARK  # in the first half of the sequence: rank 0's tokens under Ulysses, none of rank 1's
    # a sum one rank skips while the other waits in it ends in a CollectiveTimeout naming it within a minute: gloo
    # aborts on some machines (the sizes differ), on others it waits, past the default bound of 300 s
    config = ShardConfig(
        sequence_parallel_size=2,
        enable_sequence_parallelism=True,
        sequence_parallelism_mode="all_to_all",
        collective_timeout=60,
    )
    return assert_sharded_matches(_longcat_built, {"input_ids": ids, "labels": ids}, config)


def test_a_parent_reading_a_childs_weight_and_experts_a_rank_may_not_reach_under_ulysses():
    """LongCat-Flash under Ulysses (SP=2): its router reads ``self.classifier.weight`` without calling
    the classifier, and its routed experts are 4 of 260 (the rest zero-computation), so in a step one
    rank's tokens may reach them and the other's not (the first layer: a token only rank 0 holds is
    routed to them), or no rank's (the last). Each
    block parameter's gradient is still the sum over every rank's tokens (the classifier's too), the
    sums stay in step on both ranks (no rank waits in one the other never joins), and experts no token
    reached keep no gradient: exact over 3 AdamW steps."""
    for report in run_on_ranks(2, _longcat):
        assert "max_abs_diff_after_steps" in report, report


def _longcat_data_parallel(mode: str):
    from shardcore.testing import assert_data_parallel_matches
    from shardcore.testing.refusals import refusal_message

    ids = _longcat_ids()
    ids[0, 2] = _MARK  # in row 0 only: rank 0's under data parallelism, none of rank 1's
    config = ShardConfig(tensor_parallel_size=1, data_parallel=mode)
    if mode == "fsdp":
        return refusal_message(_longcat_built, config)
    import shardcore

    torch.manual_seed(0)  # the same weights on every rank
    declared = shardcore.optimize(_longcat_built(), config).shardcore.policy.data_parallel().sharded_refusal
    report = assert_data_parallel_matches(_longcat_built, {"input_ids": ids, "labels": ids}, config)
    return report | {"sharded_refusal": declared}


def test_experts_beside_zero_computation_ones_under_data_parallelism():
    """LongCat-Flash's routed experts beside zero-computation ones: row 0's marked token reaches the first
    layer's expert 0, no token of row 1 any routed expert. DDP (a row a rank) finds each step that rank 1
    left the experts without a gradient: loss, every gradient and 3 AdamW steps equal the unsharded
    model's. FSDP, which would reduce-scatter the experts' gradients on rank 0 and not on rank 1 (a crash
    on gloo, a hang on NCCL), is refused by name before any collective."""
    for report in run_on_ranks(2, _longcat_data_parallel, "ddp"):
        assert "max_abs_diff_after_steps" in report, report
        why = report["sharded_refusal"] or ""
        assert "identity_expert (moe_identity_expert)" in why, f"the plan's policy declares no FSDP refusal: {why!r}"
    for said in run_on_ranks(2, _longcat_data_parallel, "fsdp"):
        refused = "is a zero-computation expert" in said and "use data_parallel='ddp'" in said
        assert refused, f"FSDP not refused beside zero-computation experts: {said}"


def _split_gather(family: str) -> dict:
    from shardcore.tensor_parallel import count_collectives

    config = ShardConfig(
        tensor_parallel_size=2, enable_sequence_parallelism=True, sequence_parallelism_mode="split_gather"
    )
    with count_collectives() as counts:
        report = assert_sharded_matches(lambda: build(family), batch(seq=16), config)
    return report | {"collectives": dict(counts)}


@pytest.mark.parametrize("family", ["Qwen3", "Gemma3", "Phi3"])
def test_split_gather_over_the_region_the_plan_gives(family):
    """Megatron's split_gather at TP=2 on the region the shipped TP plan gives (each block's column- and
    row-parallel pairs; norms and residuals on a rank's half of the tokens): exact, the sequence gathered
    into every pair and reduce-scattered out of it."""
    for report in run_on_ranks(2, _split_gather, family):
        assert "max_abs_diff_after_steps" in report, report
        assert report["collectives"].get("reduce_scatter", 0) > 0, report["collectives"]


@pytest.mark.parametrize(
    "family, message",
    [
        ("GptOss", r"model.layers.0 holds no column- and row-parallel pair in the plan"),
        ("DeepseekV3", r"model.layers.0.self_attn.q_a_proj \(Linear\) is not split by the plan"),
        ("Olmo2", r"model.layers.0.self_attn.q_norm \(Olmo2RMSNorm\) sits in model.layers.0.self_attn, which gathers"),
    ],
    ids=["GptOss", "DeepseekV3", "Olmo2"],
)
def test_split_gather_a_plan_gives_no_region_for_is_refused_by_name(family, message):
    """GPT-OSS's plan names only its ends; DeepSeek-V3's leaves MLA's latent projections whole: each
    would run token mixing on a rank's tokens alone. OLMo-2's plan runs its attention whole on every rank
    (gathered outputs) with a norm over every head the plan does not name: whether that norm's gradient
    is a rank's share or the whole cannot be told from the plan. Each refused by name, before any
    collective."""
    import re

    from shardcore.testing.refusals import refusal_message

    config = ShardConfig(
        tensor_parallel_size=2, enable_sequence_parallelism=True, sequence_parallelism_mode="split_gather"
    )
    for said in run_on_ranks(2, refusal_message, functools.partial(build, family), config):
        assert re.search(message, said), f"not refused as expected: {said}"


def _doge():
    """Doge, its dynamic mask kept to the 6 keys of largest bias a query (of 16 tokens: the top-k acts); its
    bias's scales ``A`` drawn (zeros at init leave their gradient at the fp32 noise floor)."""
    import transformers

    model = transformers.DogeForCausalLM(transformers.DogeConfig(**COMMON | {"keep_window_size": 6}))
    for layer in model.model.layers:
        torch.nn.init.normal_(layer.self_attn.A, std=1.0)
    return model


def _dynamic_mask(mode: str) -> dict:
    import shardcore
    from shardcore.tensor_parallel import count_collectives

    with count_collectives() as counts:
        report = assert_sharded_matches(_doge, batch(seq=16), _sp2(mode))
    torch.manual_seed(0)
    model = shardcore.optimize(_doge(), _sp2(mode))
    with count_collectives() as one:  # the first forward: the builder's gathers a layer, and the output's
        model(**batch(seq=16))
    return report | {
        "all_gather": counts.get("all_gather", 0),
        "reduce_scatter": counts.get("reduce_scatter", 0),
        "forward_all_gather": one.get("all_gather", 0),
        "listed": model.shardcore.attached.describe(),
    }


@pytest.mark.parametrize("mode", ["all_to_all", "ring_attn"])
def test_a_mask_the_attention_module_builds_itself_is_built_over_the_whole_sequence(mode):
    """Doge's attention builds its mask in a method of its own (``prepare_dynamic_mask``): a learned bias a
    key and key/value head from its value states, then each query's 6 keys of largest bias kept. Under the
    split the method runs over the whole sequence (its value states' bias gathered: the top-k chooses among every
    key; its hidden states, read for their length and dtype alone, viewed at the whole length), and the attention function takes the whole mask at the rank's heads (Ulysses) or its queries (the
    ring, over gathered keys: the mask has a gradient, for the bias's weights ``A`` and ``dt_proj``)."""
    for report in run_on_ranks(2, _dynamic_mask, mode):
        assert "max_abs_diff_after_steps" in report, report
        assert report["all_gather"] > 0 and report["reduce_scatter"] > 0, report
        if mode == "all_to_all":  # per layer one gather, of the value states' bias (the hidden states, read for
            # their length and dtype alone, viewed, not gathered: 6 if they were); the last block's output gathered
            # once; the first forward's rank-consistency check once
            assert report["forward_all_gather"] == 2 + 1 + 1, (
                f"all-gathers in a forward: {report['forward_all_gather']}"
            )
        # what optimize set on the attention modules is listed with the model's attachments
        listed = report["listed"]
        found = "prepare_dynamic_mask shardcore.sequence.gathered._whole_mask: 2 modules" in listed
        assert found, f"describe() does not list the mask builder set on the attention modules: {listed}"


def _gemma4():
    """Gemma 4 with its per-layer input (an embedding of the token ids a layer, handed to each block by
    position); its full-attention heads as small as the sliding ones (512 by default, scaled by 1.0)."""
    import transformers

    own = {"head_dim": 16, "global_head_dim": 16, "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": 128}
    return transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**COMMON | own))


def _per_layer_inputs(family: str, mode: str) -> dict:
    return assert_sharded_matches(_gemma4 if family == "Gemma4" else _gemma3n, batch(seq=16), _sp2(mode))


@pytest.mark.parametrize("mode", ["all_to_all", "ring_attn"])
@pytest.mark.parametrize("family", ["Gemma4", "Gemma3n"])
def test_a_blocks_own_input_along_the_sequence_is_cut_with_it(family, mode):
    """Gemma 4 and Gemma 3n hand each block its per-layer input, ``(batch, sequence, width)``, by position
    besides the hidden states: cut with them (zigzag under the ring), each block reads its tokens' rows.
    Gemma 3n's hidden states are 4 streams stacked before the sequence, ``(4, batch, sequence, hidden)``:
    split and gathered along dim 2, as long as its rotary embeddings say the sequence is; its AltUp reads
    a weight of its own (``correct_output_scale``) in a method, not its forward, whose gradient the split
    sums over the ranks all the same."""
    for report in run_on_ranks(2, _per_layer_inputs, family, mode):
        assert "max_abs_diff_after_steps" in report, report


def _gemma3n_checkpointed(reentrant: bool) -> dict:
    from shardcore.tensor_parallel import count_collectives

    def built():
        model = _gemma3n()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        return model

    with count_collectives() as plain:
        assert_sharded_matches(_gemma3n, batch(seq=16), _sp2("all_to_all"))
    with count_collectives() as counts:
        report = assert_sharded_matches(built, batch(seq=16), _sp2("all_to_all"))
    return report | {"all_reduce": counts.get("all_reduce", 0), "plain": plain.get("all_reduce", 0)}


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_weight_a_block_reads_in_a_method_under_checkpointing(reentrant):
    """Gemma 3n under Ulysses with HuggingFace's gradient checkpointing: the layer's ``forward`` is recomputed
    in the backward without the layer's hooks, which shadow AltUp's ``correct_output_scale`` (read in a
    method of the layer's, no child's forward) so its gradient is summed over the ranks; they run around the
    recompute too (under the reentrant checkpoint the recompute's graph is the one the backward runs). As many
    all-reduces as without checkpointing: a reentrant checkpoint's forward builds no graph, and the copies the
    layer's hook made before it are dropped (each would otherwise add a sum of zeros)."""
    for report in run_on_ranks(2, _gemma3n_checkpointed, reentrant):
        assert "max_abs_diff_after_steps" in report, report
        assert report["all_reduce"] == report["plain"], (
            f"{report['all_reduce']} all-reduces, {report['plain']} unchecked"
        )


def _gemma4_pooled():
    """Gemma 4 whose per-layer input is one row a sequence (a summary of it), broadcast over the tokens."""
    model = _gemma4()
    project = model.model.project_per_layer_inputs
    model.model.project_per_layer_inputs = lambda *args, **kwargs: project(*args, **kwargs).mean(1, keepdim=True)
    return model


def _gemma3n(streams: int = 4):
    import transformers

    own = {"head_dim": 16, "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": 128}
    own |= {"layer_types": LAYERS, "num_kv_shared_layers": 0, "activation_sparsity_pattern": [0.0, 0.0]}
    own |= {"altup_num_inputs": streams, "initializer_range": 0.1}
    return transformers.Gemma3nForCausalLM(transformers.Gemma3nTextConfig(**COMMON | own))


def _gemma3n_as_many_streams_as_tokens():
    """Gemma 3n with 16 streams over 16 tokens: which stacked dimension is the sequence is not one answer."""
    return _gemma3n(16)


def _qwen3_with_an_encoder_input():
    """Qwen3 whose layers take an ``encoder_hidden_states`` tensor besides the hidden states (a cross-attention's
    keys, another sequence's): never cut as if it were the hidden states, whatever its length."""
    model = build("Qwen3")
    layer = type(model.model.layers[0])

    class Crossing(layer):
        def forward(self, hidden_states, encoder_hidden_states: torch.Tensor | None = None, **kwargs):
            return super().forward(hidden_states, **kwargs)

    for block in model.model.layers:
        block.__class__ = Crossing
    return model


def _qwen3_with_a_bare_convolution():
    """Qwen3 with a short convolution as a child of its attention module itself: no module around it to run
    over the whole sequence but the attention, which the split switches."""
    model = build("Qwen3")
    model.model.layers[0].self_attn.add_module("short_conv", torch.nn.Conv1d(64, 64, 3, groups=64, padding=2))
    return model


def _minimax_unrecognized():
    """MiniMax whose linear-attention layer holds a mixer under a name shardcore does not read as one."""
    model = build("MiniMax")
    attention = model.model.layers[0].self_attn
    renamed = type("MiniMaxLightningBlock", (type(attention),), {})
    attention.__class__ = renamed
    return model


def _inkling():
    import transformers

    own = {"head_dim": 16, "layer_types": ["hybrid_sliding", "hybrid"], "num_experts": 2}
    return transformers.InklingForCausalLM(transformers.InklingTextConfig(**COMMON | own))


@pytest.mark.parametrize("mode", ["all_to_all", "ring_attn"])
@pytest.mark.parametrize(
    "make, message",
    [
        (
            _glm_moe_dsa,
            r"GlmMoeDsaAttention uses the attention mask besides handing it to the attention function "
            r"\(indexer\(\), line \d+",
        ),
        (
            _gemma4_pooled,
            r"the blocks' 'per_layer_input' \(2, 1, 16\) does not run along the sequence of 16 tokens on dim 1",
        ),
        (
            _gemma3n_as_many_streams_as_tokens,
            r"the hidden states entering model.layers.0 have shape \(16, 2, 16, 64\), not \(batch, sequence",
        ),
        (
            _minimax_unrecognized,
            r"MiniMaxConfig has 'linear_attention' layers, which mix tokens outside transformers' attention, and "
            r"model.layers.0 holds no module shardcore recognizes as that mixer",
        ),
        (
            _qwen3_with_an_encoder_input,
            r"its blocks take 'encoder_hidden_states' besides the hidden states, named as another sequence's states",
        ),
        (
            _qwen3_with_a_bare_convolution,
            r"model.layers.0.self_attn.short_conv \(Conv1d\) mixes tokens outside the attention, over a rank's part "
            r"of them, with no module around it",
        ),
        (_inkling, r"InklingAttention hands the attention function a 'position_bias' computed over a rank's part"),
    ],
    ids=[
        "its-own-use-of-the-mask",
        "a-block-input-not-along-the-sequence",
        "stacked-streams",
        "linear-attention-unrecognized",
        "an-encoder-input",
        "a-bare-convolution",
        "a-position-bias",
    ],
)
def test_a_sequence_split_the_attention_cannot_follow_is_refused_by_name(make, message, mode):
    """GLM-MoE-DSA's sparse-attention indexer reads the whole sequence's mask beside a rank's queries and keys
    (the module then builds its mask over a rank's keys), a block input with no dimension along the sequence (Gemma 4's per-layer input pooled), Gemma 3n
    with as many streams stacked before the sequence as tokens (which dimension is the sequence: not one
    answer), a linear-attention layer whose mixer shardcore does not recognize, a convolution
    inside the attention module with nothing around it to gather, Inkling hands its attention function a
    relative position bias over a rank's queries and every head: each refused by name under Ulysses and
    the ring, the same on every rank, not run wrong."""
    import re

    config = ShardConfig(
        tensor_parallel_size=1,
        sequence_parallel_size=2,
        enable_sequence_parallelism=True,
        sequence_parallelism_mode=mode,
    )
    for said in run_on_ranks(2, _refused_in_a_step, make, config):
        assert re.search(message, said), f"not refused as expected: {said}"


def _refused_in_a_step(make, config) -> str:
    """What ``optimize`` or the first training step said (the stacked streams are seen at the first block)."""
    import shardcore
    from shardcore.testing.refusals import refusal_message

    said = refusal_message(make, config)
    if said != "no error":
        return said
    model = shardcore.optimize(make(), config)
    try:
        model(**batch(seq=16)).loss.backward()
    except NotImplementedError as err:
        return f"NotImplementedError: {err}"
    return "no error"


def _expert_parallel(family: str, tp: int) -> dict:
    from shardcore.tensor_parallel import count_collectives
    from shardcore.testing import assert_data_parallel_matches

    config = ShardConfig(tensor_parallel_size=tp, expert_parallel_size=2, data_parallel="ddp")
    with count_collectives() as counts:
        report = assert_data_parallel_matches(lambda: build(family), batch(rows=4), config, rtol_loss=2e-6)
    return report | {"all_to_all": counts.get("all_to_all", 0)}


def _indexed(ep: int) -> dict:
    from shardcore.testing import assert_data_parallel_matches

    config = ShardConfig(tensor_parallel_size=1, expert_parallel_size=ep, data_parallel="ddp")
    return assert_data_parallel_matches(lambda: build("DeepseekV32"), batch(rows=4, seq=16), config, rtol_loss=2e-6)


@pytest.mark.parametrize("ep", [1, 2], ids=["ddp", "ep2-ddp"])
def test_data_parallel_over_parameters_a_step_leaves_without_gradient(ep):
    """DeepSeek-V3.2's sparse-attention indexer gets no gradient from the model's loss (it is trained by a
    loss of its own): DDP over the zero-config model finds it each step (``DataParallelSpec.find_unused``),
    where it would otherwise never reduce the bucket holding it and leave the gradients beside it each
    rank's own (the embedding's among them). Loss, every gradient and 3 AdamW steps equal to the
    unsharded model's, under DDP and EP=2 over DDP."""
    for report in run_on_ranks(2, _indexed, ep):
        assert "max_abs_diff_after_steps" in report, report


@pytest.mark.parametrize("tp", [1, 2], ids=["ep2-ddp", "ep2-tp2"])
@pytest.mark.parametrize("family", ["GptOss", "DeepseekV3", "NemotronHMoe"])
def test_expert_parallelism_from_the_shipped_expert_plan(family, tp):
    """EP=2 over DDP (2 ranks) and EP=2 x TP=2 (4 ranks): the experts modules the config's
    base_model_ep_plan dispatches to hold whole experts over the ep x tp ranks (GPT-OSS's biases with
    them, Nemotron-H's up projection without a gate), tokens travel by all-to-all (counted); loss, every
    gradient and 3 AdamW steps equal to the unsharded model's."""
    for report in run_on_ranks(2 * tp, _expert_parallel, family, tp):
        assert "max_abs_diff_after_steps" in report, report
        assert report["all_to_all"] > 0, report


def test_a_blocks_positional_arguments_are_named_up_to_its_star_args():
    """The split reads a block's positional arguments by its forward's parameter names, up to ``*args``: an
    argument caught by ``*args`` is not the keyword-only parameter of the same name after it."""
    from shardcore.sequence.ulysses import _positional

    class Block(torch.nn.Module):
        def forward(self, hidden_states, per_layer_input, *args, position_embeddings=None, **kwargs):
            return hidden_states

    found = _positional(Block(), 4)
    assert found == {"per_layer_input": 1}, f"named past *args: {found}"


def test_a_composite_keeps_a_parts_fsdp_refusal():
    """A composite's data-parallel spec keeps a part's reason FSDP cannot run it, under the part's path."""
    from shardcore.spec import DataParallelSpec

    merged = DataParallelSpec.merge(None, {"language_model": DataParallelSpec(sharded_refusal="zero experts")})
    assert merged.sharded_refusal == "language_model: zero experts", f"the part's FSDP refusal lost: {merged}"
    assert DataParallelSpec.merge(None, {"vision": DataParallelSpec()}).sharded_refusal is None


def test_a_mask_with_a_slice_a_head_is_cut_only_where_its_slices_are_the_heads():
    """Ulysses cuts a 4-D mask with more than one slice along dim 1 to the rank's heads only where those slices
    are the query or the key/value heads; any other count is refused by name (never cut by chance)."""
    from types import SimpleNamespace

    from shardcore.sequence.check import mask_heads

    state = SimpleNamespace(mode="all_to_all", group=None)
    said = r"has 3 slices along dim 1, neither the 4 query heads nor the 2 key/value heads"
    with pytest.raises(NotImplementedError, match=said):
        mask_heads(torch.zeros(1, 3, 8, 8), 4, 2, state)
