"""DeepSeek-V2/V3 shapes: multi-head latent attention's parameters and KV cache, dense first layers among the
experts, ungated shared experts, tensor-parallel shards that copy the latent, and reading DeepSeek / Kimi K2
config.json files (sim/latent_attention.py, sim/deepseek_config.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sim.hardware import resolve_hardware
from sim.hf_model_config import model_from_hf_config
from sim.kv_cache_capacity import kv_cache_num_blocks
from sim.model_presets import resolve_model
from sim.model_shapes import ModelShape

DEEPSEEK_PRESETS = ("deepseek-v3", "deepseek-v2", "deepseek-v2-lite", "kimi-k2")


# Published totals: DeepSeek-V3 "671B total parameters with 37B activated for each token" (technical report; the
# 685B on its model card adds the 14B multi-token-prediction module), DeepSeek-V2 236B / 21B, DeepSeek-V2-Lite
# 15.7B / 2.4B, Kimi K2 1T / 32B (model cards). Activated counts leave out the input embedding (a row is gathered,
# not multiplied); ours keep it, so they are compared without it.
@pytest.mark.parametrize("name, total_billions, active_billions", [
    ("deepseek-v3", 671.0, 37.0),
    ("deepseek-v2", 236.0, 21.0),
    ("deepseek-v2-lite", 15.7, 2.4),
    ("kimi-k2", 1000.0, 32.0),
])
def test_presets_have_their_published_parameter_counts(name, total_billions, active_billions):
    model = resolve_model(name)
    assert model.is_mla and model.is_moe and model.num_dense_layers >= 1
    assert model.num_parameters / 1e9 == pytest.approx(total_billions, rel=0.03)
    embedding = model.vocab_size * model.hidden_size
    assert (model.active_parameters - embedding) / 1e9 == pytest.approx(active_billions, rel=0.03)


def test_deepseek_v3_by_hand():
    model = resolve_model("deepseek-v3")
    h, heads = 7168, 128
    attention = (h * 1536 + 1536 * heads * 192  # q_a_proj, q_b_proj
                 + h * (512 + 64)               # kv_a_proj_with_mqa: the latent and the rotary key
                 + 512 * heads * (128 + 128)    # kv_b_proj: each head's unrotated key and value
                 + heads * 128 * h)             # o_proj
    assert model.attention_projection_parameters == attention
    expert = 3 * h * 2048
    assert model.num_dense_mlp_layers == 3 and model.num_moe_layers == 58
    dense_layer = attention + 3 * h * 18432 + 2 * h + 1536 + 512  # norms: two of the layer's, q_a's and kv_a's
    moe_layer = attention + 257 * expert + h * 256 + 2 * h + 1536 + 512  # 256 routed, 1 shared, the router
    assert model.dense_layer_parameters == dense_layer and model.moe_layer_parameters == moe_layer
    assert model.shared_expert_gate_parameters == 0  # DeepSeek's shared expert has no gate
    embedding = 129280 * h
    assert model.num_parameters == 2 * embedding + 3 * dense_layer + 58 * moe_layer + h
    assert model.active_parameters == model.num_parameters - 58 * 248 * expert
    # fp8 stores the projections and every expert in one byte; not the routers, norms or embeddings.
    assert model.linear_parameters == 3 * (attention + 3 * h * 18432) + 58 * (attention + 257 * expert)
    # The cache holds one latent and one rotary key per token and layer: 576 numbers, not 2 x 128 x 192.
    assert model.kv_bytes_per_token("bfloat16") == 61 * 576 * 2
    assert model.kv_bytes_per_token("fp8") == 61 * 576


def test_a_tensor_parallel_shard_splits_the_heads_and_copies_the_latent():
    model = resolve_model("deepseek-v3")
    shard = model.shard(8)
    assert shard.num_attention_heads == 16 and shard.kv_lora_rank == 512 and shard.q_lora_rank == 1536
    # The down-projections are whole on every GPU, the heads' projections an eighth.
    whole = 7168 * 1536 + 7168 * 576
    split = 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168
    assert shard.attention_projection_parameters == whole + split // 8
    # Every GPU keeps the whole latent: its cache per token does not shrink (grouped-query attention's does).
    assert shard.kv_bytes_per_token("bfloat16") == model.kv_bytes_per_token("bfloat16")
    llama = resolve_model("llama-3-70b")
    assert llama.shard(8).kv_bytes_per_token("bfloat16") == llama.kv_bytes_per_token("bfloat16") // 8
    # The dense layers' width must split too (it prices those layers); latent attention has no KV heads to split.
    with pytest.raises(ValueError, match=r"engine.tensor_parallel_size: 8 does not divide the MLP width 18004 of"):
        replace(model, intermediate_size=18004).shard(8)
    with pytest.raises(ValueError, match=r"7 does not divide the 128 attention heads, the MLP width 18432, the "):
        model.shard(7)


def test_deepseek_v3_fits_eight_h200s_in_fp8_and_not_in_bf16():
    model, h200 = resolve_model("deepseek-v3"), resolve_hardware("h200")
    with pytest.raises(ValueError, match="no room for even one KV block"):
        kv_cache_num_blocks(model, h200, "bfloat16", 16, 0.9, tensor_parallel_size=8)
    blocks = kv_cache_num_blocks(model, h200, "bfloat16", 16, 0.9, tensor_parallel_size=8, quantization="fp8")
    # About 85 GB of weights per GPU leave ~36 GB for a cache of 70 KB per token: several hundred thousand tokens.
    assert 300_000 < blocks * 16 < 700_000
    fp8_cache = kv_cache_num_blocks(model, h200, "bfloat16", 16, 0.9, tensor_parallel_size=8, quantization="fp8",
                                    kv_cache_dtype="fp8")
    assert fp8_cache == pytest.approx(2 * blocks, abs=1)


def test_pipeline_stage_weights_count_the_dense_layers_on_the_first_stage():
    model = resolve_model("deepseek-v2-lite")  # 27 layers, the first dense
    stages = [model.pipeline_stage_weight_bytes(stage, 3, "bfloat16") for stage in range(3)]
    assert sum(stages) == model.weight_bytes("bfloat16")
    # Stage 0 holds the dense layer (lighter than an MoE layer) and the embedding; stage 1 nine MoE layers.
    assert stages[1] == 9 * model.moe_layer_parameters * 2
    assert stages[0] == (model.dense_layer_parameters + 8 * model.moe_layer_parameters
                         + model.vocab_size * model.hidden_size) * 2


@pytest.mark.parametrize("field, value, message", [
    ("q_lora_rank", 1536, "model.q_lora_rank is 1536, but model.kv_lora_rank is 0"),
    ("num_dense_layers", 2, "model.num_dense_layers is 2, but model.num_experts is 0"),
])
def test_latent_and_dense_layer_fields_without_their_feature_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        replace(resolve_model("llama-3-8b"), **{field: value})


@pytest.mark.parametrize("changes, message", [
    ({"qk_rope_head_dim": 192}, r"model.qk_rope_head_dim must be 1..head_dim - 1 \(191\)"),
    ({"qk_rope_head_dim": 0}, r"model.qk_rope_head_dim must be 1..head_dim - 1"),
    ({"v_head_dim": 0}, "model.v_head_dim must be a positive integer"),
    ({"kv_lora_rank": -1}, "model.kv_lora_rank must be an integer >= 0"),
    ({"sliding_window": 4096}, "sliding windows with multi-head latent attention"),
    ({"qkv_bias": True}, "model.qkv_bias"),
    ({"num_dense_layers": 61}, r"model.num_dense_layers must be 0..num_layers - 1 \(60\)"),
])
def test_impossible_deepseek_shapes_are_refused_by_field(changes, message):
    with pytest.raises(ValueError, match=message):
        replace(resolve_model("deepseek-v3"), **changes)


# --- config.json ------------------------------------------------------------------------------------------

# The keys of the published config.json files that the shape reads (DeepSeek-V3's adds quantization, rope
# scaling and routing keys, ignored here as they are by the cost model).
DEEPSEEK_V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
    "max_position_embeddings": 163840, "tie_word_embeddings": False, "hidden_act": "silu",
    "num_nextn_predict_layers": 1, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "attention_bias": False,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}
DEEPSEEK_V2_LITE_CONFIG = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16,
    "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64, "num_experts_per_tok": 6,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 102400,
    "max_position_embeddings": 163840, "tie_word_embeddings": False, "hidden_act": "silu",
}
KIMI_K2_CONFIG = {**DEEPSEEK_V3_CONFIG, "model_type": "kimi_k2", "num_attention_heads": 64, "num_nextn_predict_layers": 0,
                  "num_key_value_heads": 64, "n_routed_experts": 384, "first_k_dense_replace": 1,
                  "vocab_size": 163840, "max_position_embeddings": 131072}


def write_config(tmp_path, config: dict, name: str = "model"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder / "config.json"


@pytest.mark.parametrize("config, preset", [(DEEPSEEK_V3_CONFIG, "deepseek-v3"),
                                            (DEEPSEEK_V2_LITE_CONFIG, "deepseek-v2-lite"),
                                            (KIMI_K2_CONFIG, "kimi-k2")])
def test_a_config_json_reads_as_its_preset(tmp_path, config, preset):
    shape = model_from_hf_config(write_config(tmp_path, config))
    assert replace(shape, name=preset) == resolve_model(preset)
    # Through the workload's model: key too (a folder holding a config.json).
    assert replace(resolve_model(str(tmp_path / "model")), name=preset) == resolve_model(preset)


def test_a_model_type_alone_names_the_architecture_and_defaults_fill_left_out_keys(tmp_path):
    config = {key: value for key, value in DEEPSEEK_V3_CONFIG.items()
              if key not in ("architectures", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim",
                             "n_shared_experts", "first_k_dense_replace")}
    shape = model_from_hf_config(write_config(tmp_path, config))
    assert replace(shape, name="deepseek-v3") == resolve_model("deepseek-v3")


def test_a_deepseek_v2_without_routed_experts_is_a_dense_model_with_latent_attention(tmp_path):
    config = {**DEEPSEEK_V2_LITE_CONFIG, "n_routed_experts": None, "first_k_dense_replace": 0}
    shape = model_from_hf_config(write_config(tmp_path, config))
    assert shape.is_mla and not shape.is_moe and shape.num_dense_mlp_layers == 27


@pytest.mark.parametrize("changes, message", [
    ({"moe_layer_freq": 2}, "key 'moe_layer_freq' is 2"),
    ({"first_k_dense_replace": 27}, r"key 'first_k_dense_replace' must be 0..num_hidden_layers - 1 \(26\)"),
    ({"num_experts_per_tok": 65}, "key 'num_experts_per_tok' is 65, more than the 64 experts"),
    ({"hidden_act": "gelu"}, "key 'hidden_act' is 'gelu'"),
    ({"attention_bias": True}, "key 'attention_bias' is true"),
    ({"kv_lora_rank": 0}, "key 'kv_lora_rank' must be a positive integer"),
    ({"n_shared_experts": -1}, "key 'n_shared_experts' must be an integer >= 0"),
])
def test_bad_deepseek_configs_are_refused_naming_the_key(tmp_path, changes, message):
    path = write_config(tmp_path, {**DEEPSEEK_V2_LITE_CONFIG, **changes})
    with pytest.raises(ValueError, match=message) as error:
        model_from_hf_config(path)
    assert str(path) in str(error.value)


def test_an_inline_model_can_describe_latent_attention():
    shape = resolve_model({"name": "mla-toy", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                           "num_kv_heads": 4, "head_dim": 48, "intermediate_size": 512, "vocab_size": 1000,
                           "max_position_embeddings": 4096, "kv_lora_rank": 64, "qk_rope_head_dim": 16,
                           "v_head_dim": 32})
    assert isinstance(shape, ModelShape) and shape.kv_bytes_per_token("bfloat16") == 4 * 80 * 2


# --- GLM-4.5 (DeepSeek's mixture of experts with grouped-query attention) and Qwen3-235B -----------------------

# Published: GLM-4.5 355B total / 32B active, GLM-4.5-Air 106B / 12B (model cards; their totals add the
# multi-token-prediction layer, their active counts leave the embedding out); Qwen3-235B-A22B 235B / 22B.
@pytest.mark.parametrize("name, total_billions, active_billions", [
    ("glm-4.5", 355.0, 32.0), ("glm-4.5-air", 106.0, 12.0), ("qwen3-235b-a22b", 235.0, 22.0)])
def test_more_presets_have_their_published_parameter_counts(name, total_billions, active_billions):
    model = resolve_model(name)
    assert model.num_parameters / 1e9 == pytest.approx(total_billions, rel=0.02)
    embedding = model.vocab_size * model.hidden_size
    assert (model.active_parameters - embedding) / 1e9 == pytest.approx(active_billions, rel=0.07)


GLM_4_5_AIR_CONFIG = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "attention_bias": True, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 10944, "max_position_embeddings": 131072,
    "moe_intermediate_size": 1408, "n_group": 1, "n_routed_experts": 128, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 46,
    "num_key_value_heads": 8, "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5,
    "first_k_dense_replace": 1, "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_group": 1,
    "use_qk_norm": False, "vocab_size": 151552,
}


def test_a_glm_config_json_reads_as_its_preset_with_grouped_query_attention(tmp_path):
    shape = model_from_hf_config(write_config(tmp_path, GLM_4_5_AIR_CONFIG))
    assert replace(shape, name="glm-4.5-air") == resolve_model("glm-4.5-air")
    assert not shape.is_mla and shape.num_dense_mlp_layers == 1 and shape.shared_expert_gate_parameters == 0
    # GLM-4.5 (its own config: 92 layers, 160 experts, 3 dense layers, hidden 5120 with 128-wide heads).
    glm = {**GLM_4_5_AIR_CONFIG, "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
           "n_routed_experts": 160, "num_hidden_layers": 92, "first_k_dense_replace": 3}
    path = write_config(tmp_path, glm, "glm-4.5")
    assert replace(model_from_hf_config(path), name="glm-4.5") == resolve_model("glm-4.5")
