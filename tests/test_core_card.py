"""The check card's own logic, without processes: the parts a model's parameters are grouped by
(Llama, Mixtral, Llava, GPT-2, BERT, built on the meta device), the reduction of a large config
(what the layout depends on kept), and the rows made from the ranks' numbers (a wrong gradient
fails the card naming its part, its parameter and its number)."""

from __future__ import annotations

import math

import pytest
import transformers

import shardcore
from shardcore import ShardConfig
from shardcore.card import ModelSource, parts_of, reduce_config
from shardcore.card.rows import card_from_ranks


def _meta(config, cls):
    with shardcore.init_empty():
        return cls(config)


def test_llama_and_mixtral_parameters_fall_in_their_parts():
    llama = _meta(transformers.LlamaConfig(num_hidden_layers=1, hidden_size=64, intermediate_size=128,
                                           num_attention_heads=4, vocab_size=100), transformers.LlamaForCausalLM)  # fmt: skip
    parts = parts_of(llama)
    want = {
        "model.embed_tokens.weight": "embeddings",
        "model.layers.0.self_attn.q_proj.weight": "attention",
        "model.layers.0.mlp.gate_proj.weight": "mlp",
        "model.layers.0.input_layernorm.weight": "norms",
        "model.norm.weight": "norms",
        "lm_head.weight": "head",
    }
    assert {n: parts[n] for n in want} == want and set(parts.values()) == set(want.values())
    mixtral = _meta(transformers.MixtralConfig(num_hidden_layers=1, hidden_size=64, intermediate_size=64,
                                               num_attention_heads=4, num_local_experts=4, vocab_size=100),
                    transformers.MixtralForCausalLM)  # fmt: skip
    moe = {n: p for n, p in parts_of(mixtral).items() if ".mlp." in n}
    assert moe and set(moe.values()) == {"experts and router"}, moe


def test_vision_gpt2_and_bert_parameters_fall_in_their_parts():
    llava = _meta(
        transformers.LlavaConfig(
            vision_config=transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                        num_attention_heads=4, image_size=16, patch_size=8),
            text_config=transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                                 num_attention_heads=4, vocab_size=100),
        ),
        transformers.LlavaForConditionalGeneration,
    )  # fmt: skip
    parts = parts_of(llava)
    vision = {n for n, p in parts.items() if p == "vision tower or projector"}
    assert vision == {n for n in parts if n.startswith(("model.vision_tower.", "model.multi_modal_projector."))}
    assert parts["model.language_model.layers.0.self_attn.o_proj.weight"] == "attention"
    gpt2 = parts_of(
        _meta(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=100), transformers.GPT2LMHeadModel)
    )
    assert (gpt2["transformer.h.0.attn.c_attn.weight"], gpt2["transformer.h.0.mlp.c_fc.weight"]) == ("attention", "mlp")
    assert gpt2["transformer.wpe.weight"] == "embeddings" and gpt2["transformer.h.0.ln_1.weight"] == "norms"
    bert = parts_of(_meta(transformers.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=4,
                                                  intermediate_size=64, vocab_size=100), transformers.BertModel))  # fmt: skip
    assert bert["encoder.layer.0.attention.output.dense.weight"] == "attention"
    assert bert["encoder.layer.0.intermediate.dense.weight"] == "mlp"
    assert bert["encoder.layer.0.attention.output.LayerNorm.weight"] == "norms"


def test_a_reduced_config_keeps_what_the_layout_depends_on():
    config = transformers.Gemma3TextConfig(
        num_hidden_layers=62, hidden_size=5376, intermediate_size=21504, num_attention_heads=32,
        num_key_value_heads=16, head_dim=128, vocab_size=262208, sliding_window_pattern=6,
    )  # fmt: skip
    types = list(config.layer_types)
    changed = reduce_config(config, pp=2)
    # sliding layers first, the global one sixth: every type kept, a multiple of the stages
    assert config.num_hidden_layers == 6 and config.layer_types == types[:6] and set(config.layer_types) == set(types)
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (32, 16, 262208)
    assert (config.head_dim, config.hidden_size, config.intermediate_size) == (8, 256, 512)
    assert changed["num_hidden_layers"] == (62, 6) and changed["head_dim"] == (128, 8)
    llama = transformers.LlamaConfig(num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                                     hidden_size=8192, tie_word_embeddings=True)  # fmt: skip
    assert reduce_config(llama, pp=4)["num_hidden_layers"] == (80, 8) and llama.tie_word_embeddings


def test_a_small_model_is_checked_whole_and_dropout_is_off(tmp_path):
    transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                             attention_dropout=0.1, architectures=["LlamaForCausalLM"]).save_pretrained(tmp_path)  # fmt: skip
    config, _, reduced = ModelSource(str(tmp_path)).plan()
    assert reduced == {} and config.attention_dropout == 0.0
    with pytest.raises(ValueError, match="neither a directory"):
        ModelSource("no_such_thing").plan()


def test_shardcore_check_is_the_card_s_check():
    import shardcore.card

    assert shardcore.check is shardcore.card.check


def _rank(grad_error: float, norm: tuple[float, float] = (2.0, 2.0)) -> dict:
    return {
        "losses": [(1.0, 1.0), (0.9, 0.9)],
        "norms": [norm, (1.5, 1.5)],
        "parts": {"a.attn.w": "attention", "a.mlp.w": "mlp", "head.w": "head"},
        "gradients": {"a.attn.w": grad_error, "a.mlp.w": 1e-7},
        "parameters": {"a.attn.w": 1e-8, "a.mlp.w": 2e-8},
        "update": 1e-3,
        "collectives": {"all_reduce": 3},
        "torch_calls": {"all_reduce": 3},
        "held": ["a.attn.w", "a.mlp.w"],
        "all": [["a.attn.w"], ["a.mlp.w"]],
    }


def test_a_wrong_number_fails_the_card_naming_its_part_parameter_and_size():
    good = card_from_ranks([_rank(1e-7), _rank(2e-7)], model="m", layout="tp2", reduced={})
    assert good.passed and "PASS" in good.format()
    bad = card_from_ranks([_rank(1e-7), _rank(0.5)], model="m", layout="tp2", reduced={})
    assert [(r.what, r.error, r.where) for r in bad.failures] == [("gradients: attention", 0.5, "a.attn.w")]
    assert "FAIL: gradients: attention 0.5 > 0.0001 at a.attn.w" in bad.format()
    norm = card_from_ranks([_rank(1e-7, (2.0, 2.1)), _rank(1e-7)], model="m", layout="tp2", reduced={})
    assert [r.what for r in norm.failures] == ["clip_grad_norm_'s norm"]
    lost = _rank(1e-7)
    lost["all"] = [["a.attn.w"], ["a.mlp.w"], ["b.w", "c.w"]]
    assert [r.where for r in card_from_ranks([lost], model="m", layout="tp1", reduced={}).failures] == ["b.w"]


def test_a_world_above_the_machine_runs_each_dimension_at_two_every_pair_together():
    from shardcore.card.large import MAX_WORLD, scaled_layouts

    three = ShardConfig(tensor_parallel_size=8, pipeline_parallel_size=4, num_microbatches=8,
                        pipeline_layers=(2, 2, 2, 2), data_parallel="fsdp", data_parallel_size=4,
                        expert_parallel_size=4)  # fmt: skip
    (one,) = scaled_layouts(three)
    assert (one.tensor_parallel_size, one.pipeline_parallel_size, one.data_parallel_size) == (2, 2, 2)
    assert (one.expert_parallel_size, one.pipeline_layers, one.num_microbatches) == (2, None, None)
    four = ShardConfig(tensor_parallel_size=4, pipeline_parallel_size=2, sequence_parallel_size=4,
                       enable_sequence_parallelism=True, sequence_parallelism_mode="all_to_all",
                       data_parallel="hsdp", data_parallel_size=4, data_parallel_shard_size=2)  # fmt: skip
    runs = scaled_layouts(four)  # 2 ** 4 = 16 ranks do not fit: each dimension left out once
    sizes = {(c.tensor_parallel_size, c.pipeline_parallel_size, c.sequence_parallel_size, c.data_parallel_size or 1)
             for c in runs}  # fmt: skip
    assert sizes == {(1, 2, 2, 2), (2, 1, 2, 2), (2, 2, 1, 2), (2, 2, 2, 1)}, sizes
    for c in runs:
        dims = (c.tensor_parallel_size, c.pipeline_parallel_size, c.sequence_parallel_size, c.data_parallel_size or 1)
        assert math.prod(dims) <= MAX_WORLD
        assert (c.sequence_parallelism_mode is None) == (c.sequence_parallel_size == 1), c
        assert c.data_parallel == (None if (c.data_parallel_size or 1) == 1 else "hsdp"), c


def test_the_built_ranks_take_every_coordinate_of_every_dimension():
    from shardcore.card.large import sampled_ranks
    from shardcore.distributed.layout import ParallelLayout

    config = ShardConfig(tensor_parallel_size=4, pipeline_parallel_size=4, data_parallel="ddp", data_parallel_size=2)
    layout = ParallelLayout.from_config(config, world_size=32)
    ranks = sampled_ranks(config, 32)
    for dim, size in (("tp", 4), ("pp", 4), ("dp", 2)):
        assert {layout.coordinates(r)[dim] for r in ranks} == set(range(size)), (dim, ranks)
    assert len(ranks) == 1 + 3 + 3 + 1 + 1  # rank 0, the other coordinates of each dimension, the last rank


def test_a_parameter_no_built_rank_holds_fails_the_whole_world_s_row():
    from shardcore.card.large import world_rows

    names = [["model.embed_tokens.weight", "lm_head.weight"], ["model.layers.0.mlp.up_proj.weight"]]
    ranks = [{"rank": 0, "held": {"lm_head.weight": 8}}, {"rank": 3, "held": {"model.layers.0.mlp.up_proj.weight": 4}}]
    build, held = world_rows({"names": names, "ranks": ranks}, 16)
    assert build.passed and held.passed and held.where == "4-8 per rank", held
    build, held = world_rows({"names": names, "ranks": ranks[:1]}, 16)
    assert not held.passed and held.where == "model.layers.0.mlp.up_proj.weight", held


def test_the_reference_norm_is_summed_in_float64():
    """torch's float32 norm of one large tensor misses by more than the card's tolerance on some CPUs (AVX2:
    2.5e-4 at 8M entries); the card's reference norm, and the clipping by it, are exact to float64."""
    import torch

    from shardcore.card.rank import _reference_clip

    torch.manual_seed(0)
    ref = torch.nn.Linear(2048, 4096, bias=False)  # 8M entries: a large head's
    ref.weight.grad = torch.randn_like(ref.weight) * 1e-3
    exact = ref.weight.grad.double().pow(2).sum().sqrt()
    before = ref.weight.grad.clone()
    total = _reference_clip(ref, max_norm=0.5)
    assert abs(total.item() / exact.item() - 1) < 1e-9, (total.item(), exact.item())
    scale = 0.5 / (exact.item() + 1e-6)  # clip_grads_with_norm_'s factor
    assert torch.allclose(ref.weight.grad, before * scale, rtol=1e-6, atol=0), "not clipped by the exact norm"


def test_odd_sizes_run_at_their_smallest_factor_and_mixed_precision_leaves_with_data_parallelism():
    from shardcore.card.large import scaled_layouts

    config = ShardConfig(
        tensor_parallel_size=3,
        pipeline_parallel_size=2,
        data_parallel="fsdp",
        data_parallel_size=2,
        mixed_precision="bf16",
    )  # fmt: skip  (12 ranks: 3 x 2 x 2 does not fit 8)
    runs = scaled_layouts(config)
    sizes = [(c.tensor_parallel_size, c.pipeline_parallel_size, c.data_parallel_size or 1) for c in runs]
    assert sizes == [(3, 2, 1), (3, 1, 2), (1, 2, 2)], sizes  # every pair together, tp at 3 (heads split 3 ways)
    assert [c.mixed_precision for c in runs] == [None, "bf16", "bf16"]  # FSDP's own setting, off without it


def test_the_default_batch_cuts_into_the_layout_s_microbatches():
    import transformers

    from shardcore.card import default_batch

    text = transformers.LlamaConfig(vocab_size=64)
    batch = default_batch(text, ShardConfig(pipeline_parallel_size=2, num_microbatches=8, data_parallel="ddp",
                                            data_parallel_size=2))  # fmt: skip
    assert batch["input_ids"].shape == (16, 16), batch["input_ids"].shape  # 8 rows per data-parallel part
    assert default_batch(text, ShardConfig(pipeline_parallel_size=2))["input_ids"].shape[0] == 4
