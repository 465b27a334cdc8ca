"""Mixture-of-experts model shapes: the presets' parameter counts, validation, tensor-parallel shards,
weight bytes for KV-cache sizing, and reading Mixtral / Qwen2-MoE / Qwen3-MoE config.json files."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sim.hardware import resolve_hardware
from sim.hf_model_config import model_from_hf_config
from sim.model_presets import resolve_model
from sim.kv_cache_capacity import kv_cache_num_blocks
from sim.model_shapes import ModelShape

MOE_PRESETS = ("mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen1.5-moe-a2.7b")


# Published figures (model cards and release posts): total and active parameters per token.
# Mixtral-8x7B: "46.7B total parameters but only uses 12.9B parameters per token" (Mistral AI's release).
# Mixtral-8x22B: "141B parameters, 39B active" (Mistral AI's release).
# Qwen3-30B-A3B: "30.5B in total and 3.3B activated" (model card).
# Qwen1.5-MoE-A2.7B: 14.3B in total, 2.7B activated (model card and Qwen's release post).
@pytest.mark.parametrize("name, total_billions, active_billions", [
    ("mixtral-8x7b", 46.7, 12.9),
    ("mixtral-8x22b", 141.0, 39.0),
    ("qwen3-30b-a3b", 30.5, 3.3),
    ("qwen1.5-moe-a2.7b", 14.3, 2.7),
])
def test_moe_presets_have_their_published_parameter_counts(name, total_billions, active_billions):
    model = resolve_model(name)
    assert model.is_moe
    assert model.num_parameters / 1e9 == pytest.approx(total_billions, rel=0.01)
    # Qwen3's 3.35B computed against "3.3B": published figures are rounded down to one decimal.
    assert model.active_parameters / 1e9 == pytest.approx(active_billions, rel=0.02)


def test_mixtral_8x7b_by_hand():
    model = resolve_model("mixtral-8x7b")
    h, width, layers = 4096, 14336, 32
    attention = h * (4096 + 2 * 1024) + 4096 * h
    expert = 3 * h * width
    router = h * 8
    assert model.expert_parameters == expert and model.router_parameters == router
    assert model.layer_parameters == attention + 8 * expert + router + 2 * h
    assert model.num_parameters == 2 * 32000 * h + layers * model.layer_parameters + h
    assert model.active_parameters == model.num_parameters - layers * 6 * expert
    # fp8 stores every expert in one byte, not the router: linear parameters are attention and experts.
    assert model.linear_parameters == layers * (attention + 8 * expert)
    assert model.num_dense_mlp_layers == 0 and model.num_moe_layers == layers  # intermediate_size prices nothing


def test_qwen_moe_shared_expert_and_its_gate():
    model = resolve_model("qwen1.5-moe-a2.7b")
    h = 2048
    assert model.shared_expert_parameters == 3 * h * 5632
    assert model.shared_expert_gate_parameters == h
    # The shared expert is quantized with the experts; its [hidden, 1] gate and the router are not.
    attention = h * 3 * 2048 + 2048 * h
    assert model.layer_linear_parameters == attention + 60 * 3 * h * 1408 + 3 * h * 5632
    bias = 3 * 2048
    assert model.layer_parameters == model.layer_linear_parameters + h * 60 + h + bias + 2 * h
    # Every token runs the shared expert: it is active, as are 4 of the 60 routed experts.
    assert model.active_parameters == model.num_parameters - 24 * 56 * 3 * h * 1408


def test_a_dense_model_is_unchanged_by_the_expert_fields():
    dense = resolve_model("llama-3-8b")
    assert not dense.is_moe
    assert dense.active_parameters == dense.num_parameters
    assert dense.router_parameters == dense.shared_expert_gate_parameters == dense.expert_parameters == 0
    assert dense.num_parameters == 8_030_261_248  # as before the expert fields existed


@pytest.mark.parametrize("changes, message", [
    ({"num_experts": 8, "num_experts_per_token": 0, "moe_intermediate_size": 64},
     r"model.num_experts_per_token must be 1..num_experts \(8\) for a mixture of experts, got 0"),
    ({"num_experts": 8, "num_experts_per_token": 9, "moe_intermediate_size": 64},
     r"model.num_experts_per_token must be 1..num_experts \(8\)"),
    ({"num_experts": 8, "num_experts_per_token": 2}, "model.moe_intermediate_size must be a positive integer"),
    ({"num_experts_per_token": 2}, "model.num_experts_per_token is 2, but model.num_experts is 0"),
    ({"shared_expert_intermediate_size": 128}, "model.shared_expert_intermediate_size is 128, but model.num_experts"),
    ({"num_experts": -1}, "model.num_experts must be an integer >= 0, got -1"),
    ({"num_experts": 8, "num_experts_per_token": 2, "moe_intermediate_size": 64, "gated_mlp": False},
     "model.gated_mlp must be true for a mixture of experts"),
])
def test_expert_fields_are_validated_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        replace(resolve_model("tiny"), **changes)


def test_an_inline_moe_model():
    model = resolve_model({"name": "my-moe", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                           "num_kv_heads": 2, "intermediate_size": 128, "vocab_size": 512,
                           "max_position_embeddings": 2048, "num_experts": 4, "num_experts_per_token": 2,
                           "moe_intermediate_size": 32})
    assert model.is_moe and model.head_dim == 16
    assert model.active_parameters == model.num_parameters - 2 * 2 * 3 * 64 * 32


# --- tensor and pipeline parallelism -----------------------------------------------------------------

def test_tensor_parallelism_splits_every_expert_and_keeps_the_router_whole():
    model = resolve_model("mixtral-8x7b")
    shard = model.shard(2)
    assert (shard.num_experts, shard.num_experts_per_token, shard.moe_intermediate_size) == (8, 2, 7168)
    assert shard.router_parameters == model.router_parameters  # replicated on every GPU
    assert 2 * shard.linear_parameters == model.linear_parameters
    qwen = resolve_model("qwen1.5-moe-a2.7b").shard(4)
    assert (qwen.moe_intermediate_size, qwen.shared_expert_intermediate_size) == (352, 1408)
    assert qwen.shared_expert_gate_parameters == 2048


def test_tensor_parallelism_refuses_an_expert_width_it_cannot_split():
    odd = replace(resolve_model("qwen3-30b-a3b"), moe_intermediate_size=770)
    with pytest.raises(ValueError, match="^engine.tensor_parallel_size: 4 does not divide the expert width "
                                         "moe_intermediate_size 770 of model 'qwen3-30b-a3b'"):
        odd.shard(4)
    shared = replace(resolve_model("qwen1.5-moe-a2.7b"), shared_expert_intermediate_size=5630)
    with pytest.raises(ValueError, match="shared_expert_intermediate_size 5630"):
        shared.shard(4)
    # An MoE shape's dense intermediate_size prices nothing, so it does not stop a split.
    assert replace(resolve_model("mixtral-8x7b"), intermediate_size=14337).shard(2).moe_intermediate_size == 7168


@pytest.mark.parametrize("name", MOE_PRESETS)
@pytest.mark.parametrize("pipeline_parallel_size, quantization", [(1, None), (2, "fp8"), (4, None)])
def test_pipeline_stages_hold_all_experts_between_them(name, pipeline_parallel_size, quantization):
    model = resolve_model(name)
    stages = [model.pipeline_stage_weight_bytes(stage, pipeline_parallel_size, "bfloat16", quantization)
              for stage in range(pipeline_parallel_size)]
    # Untied embeddings: the stages share out exactly the model's weights.
    assert sum(stages) == model.weight_bytes("bfloat16", quantization)


def test_fp8_stores_experts_and_shared_expert_in_one_byte_and_the_router_in_two():
    model = resolve_model("qwen1.5-moe-a2.7b")
    saved = model.weight_bytes("bfloat16") - model.weight_bytes("bfloat16", "fp8")
    assert saved == model.linear_parameters
    assert model.num_layers * (60 * model.expert_parameters + model.shared_expert_parameters) < saved


# --- KV-cache sizing counts every expert ---------------------------------------------------------------

def test_mixtral_8x7b_in_bf16_does_not_fit_one_h100_and_fits_two():
    model, h100 = resolve_model("mixtral-8x7b"), resolve_hardware("h100-sxm")
    # 46.7B parameters x 2 bytes = 93.4 GB (86.99 GiB) > 0.9 x 80 GB: all eight experts are held.
    with pytest.raises(ValueError, match=r"^model: mixtral-8x7b weights take 86.99 GiB in bfloat16, but h100-sxm"):
        kv_cache_num_blocks(model, h100, "bfloat16", 16, 0.9)
    blocks = kv_cache_num_blocks(model, h100, "bfloat16", 16, 0.9, tensor_parallel_size=2)
    total = h100.memory_bytes
    shard = model.shard(2)
    block_bytes = 16 * shard.kv_bytes_per_token("bfloat16")
    assert blocks == int((0.9 * total - 2 * shard.num_parameters - 0.03 * total) // block_bytes)
    assert shard.num_parameters * 2 > 0.49 * model.num_parameters * 2  # about half of all experts per GPU


# --- config.json ---------------------------------------------------------------------------------------

MIXTRAL_8X7B_CONFIG = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 32768,
    "hidden_act": "silu", "tie_word_embeddings": False, "rope_theta": 1e6, "sliding_window": None,
}
QWEN1_5_MOE_CONFIG = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
    "intermediate_size": 5632, "num_attention_heads": 16, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "vocab_size": 151936, "max_position_embeddings": 8192, "hidden_act": "silu", "tie_word_embeddings": False,
}
QWEN3_30B_A3B_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048, "head_dim": 128,
    "intermediate_size": 6144, "num_attention_heads": 32, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "norm_topk_prob": True, "attention_bias": False, "vocab_size": 151936,
    "max_position_embeddings": 40960, "hidden_act": "silu", "tie_word_embeddings": False,
}


def _write(tmp_path, config: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def _fields_but_name(shape: ModelShape) -> dict:
    values = shape.to_dict()
    del values["name"]
    return values


@pytest.mark.parametrize("config, preset", [
    (MIXTRAL_8X7B_CONFIG, "mixtral-8x7b"), (QWEN1_5_MOE_CONFIG, "qwen1.5-moe-a2.7b"),
    (QWEN3_30B_A3B_CONFIG, "qwen3-30b-a3b"),
])
def test_moe_config_json_matches_the_preset(tmp_path, config, preset):
    assert _fields_but_name(model_from_hf_config(_write(tmp_path, config))) == _fields_but_name(resolve_model(preset))


def test_moe_config_json_by_model_type_and_defaults(tmp_path):
    # No architectures: the model_type decides; keys left out take transformers' defaults.
    config = {k: v for k, v in QWEN1_5_MOE_CONFIG.items()
              if k not in ("architectures", "num_experts", "shared_expert_intermediate_size")}
    model = model_from_hf_config(_write(tmp_path, config))
    assert (model.num_experts, model.shared_expert_intermediate_size, model.qkv_bias) == (60, 5632, True)
    # A Qwen2-MoE config may turn its shared expert off with 0, and its q/k/v bias with qkv_bias.
    model = model_from_hf_config(_write(tmp_path, {**QWEN1_5_MOE_CONFIG, "shared_expert_intermediate_size": 0,
                                                   "qkv_bias": False}))
    assert (model.shared_expert_intermediate_size, model.shared_expert_gate_parameters, model.qkv_bias) == (0, 0, False)


@pytest.mark.parametrize("config, message", [
    ({**QWEN3_30B_A3B_CONFIG, "mlp_only_layers": [0, 47]}, "key 'mlp_only_layers' is \\[0, 47\\]"),
    ({**QWEN1_5_MOE_CONFIG, "decoder_sparse_step": 2}, "key 'decoder_sparse_step' is 2"),
    ({**MIXTRAL_8X7B_CONFIG, "num_experts_per_tok": 9}, "key 'num_experts_per_tok' is 9, more than the 8 experts "
                                                        "\\('num_local_experts'\\)"),
    ({**QWEN3_30B_A3B_CONFIG, "num_experts": "128"}, "key 'num_experts' must be a positive integer"),
    # transformers 5 saves a Qwen3-MoE's num_experts as num_local_experts, and reads that key first.
    ({**QWEN3_30B_A3B_CONFIG, "num_local_experts": 4}, "key 'num_experts_per_tok' is 8, more than the 4 experts "
                                                       "\\('num_local_experts'\\)"),
    ({**QWEN3_30B_A3B_CONFIG, "moe_intermediate_size": 0}, "key 'moe_intermediate_size' must be a positive integer"),
    ({k: v for k, v in MIXTRAL_8X7B_CONFIG.items() if k != "intermediate_size"}, "lacks the key 'intermediate_size'"),
])
def test_moe_config_json_refuses_what_the_shape_cannot_model_by_key(tmp_path, config, message):
    with pytest.raises(ValueError, match=f"^model: .*{message}"):
        resolve_model(str(_write(tmp_path, config)))


def test_dense_config_json_is_read_as_before(tmp_path):
    config = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
              "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "vocab_size": 151936,
              "max_position_embeddings": 131072, "tie_word_embeddings": True,
              # MoE keys in a dense architecture's config are not read.
              "num_experts": 8}
    model = model_from_hf_config(_write(tmp_path, config))
    assert _fields_but_name(model) == _fields_but_name(resolve_model("qwen2-0.5b"))
