"""Hardware and model presets, config.json loading, and KV-cache sizing."""

from __future__ import annotations

import json
import math

import pytest

from sim.hardware import HARDWARE_PRESETS, HardwareSpec, resolve_hardware
from sim.hf_model_config import model_from_hf_config
from sim.model_presets import MODEL_PRESETS, resolve_model
from sim.kv_cache_capacity import kv_cache_num_blocks
from sim.model_shapes import ModelShape, dtype_bytes

GIB = 2**30

# --- hardware ----------------------------------------------------------------------------------------


def test_required_hardware_presets_exist_with_plausible_figures():
    for name in ("b200", "h100-sxm", "h100-pcie", "h200", "a100-80gb", "a100-40gb", "l4", "l40s", "a10g", "cpu"):
        spec = resolve_hardware(name)
        assert spec.name == name
        assert 0 < spec.gemm_flops_efficiency <= 1 and 0 < spec.bandwidth_efficiency <= 1
        assert spec.step_overhead_s < 0.01 and spec.kernel_launch_overhead_s < 1e-4
    a100, h100 = resolve_hardware("a100-80gb"), resolve_hardware("h100-sxm")
    assert (a100.dense_fp16_tflops, a100.memory_bandwidth_gbps) == (312.0, 2039)  # dense, not sparse
    assert h100.dense_fp16_tflops == pytest.approx(989.5)
    assert resolve_hardware("h200").memory_bandwidth_gbps > h100.memory_bandwidth_gbps > a100.memory_bandwidth_gbps
    assert 79 < h100.memory_gib < 80  # 81559 MiB as nvidia-smi shows it
    assert resolve_hardware("A100-80GB") is a100  # names are case-insensitive
    b200 = resolve_hardware("b200")
    assert (b200.dense_fp16_tflops, b200.dense_fp8_tflops) == (2250.0, 4500.0)  # dense, not sparse
    assert b200.interconnect_bandwidth_gbps == 2 * h100.interconnect_bandwidth_gbps  # NVLink 5 against 4
    # fp8 tensor cores on Hopper, Ada and Blackwell only; every GPU names its link, the CPU placeholder none.
    assert [name for name in ("b200", "h100-sxm", "h200", "l4", "l40s", "a100-80gb", "a10g")
            if resolve_hardware(name).dense_fp8_tflops > 0] == ["b200", "h100-sxm", "h200", "l4", "l40s"]
    assert resolve_hardware("cpu").interconnect_bandwidth_gbps is None


def test_peak_flops_follow_the_dtype():
    a100 = resolve_hardware("a100-80gb")
    assert a100.peak_flops("bfloat16") == a100.peak_flops("fp16") == 312e12
    assert a100.peak_flops("float32") == 19.5e12


def test_unknown_hardware_preset_lists_the_presets():
    with pytest.raises(ValueError) as error:
        resolve_hardware("b300")
    message = str(error.value)
    assert message.startswith("hardware: unknown preset 'b300'")
    assert all(name in message for name in HARDWARE_PRESETS)


def test_inline_hardware_from_a_preset_with_overrides():
    spec = resolve_hardware({"preset": "a100-80gb", "bandwidth_efficiency": 0.7, "name": "my-a100"})
    assert (spec.name, spec.bandwidth_efficiency, spec.memory_bandwidth_gbps) == ("my-a100", 0.7, 2039)


def test_inline_hardware_in_full():
    spec = resolve_hardware({"name": "mi300x", "dense_fp16_tflops": 1307.4, "fp32_tflops": 163.4,
                             "memory_bandwidth_gbps": 5300, "memory_gib": 192})
    assert isinstance(spec, HardwareSpec) and spec.memory_bytes == 192 * GIB


@pytest.mark.parametrize("value, message", [
    ({"preset": "a100-80gb", "bandwith_gbps": 1}, "hardware: unknown key 'bandwith_gbps'"),
    ({"name": "x", "dense_fp16_tflops": 1, "fp32_tflops": 1, "memory_gib": 1},
     "hardware: missing key 'memory_bandwidth_gbps'"),
    # Every missing key at once, not one per attempt.
    ({"name": "x", "dense_fp16_tflops": 100}, "hardware: missing keys 'fp32_tflops', 'memory_bandwidth_gbps', 'memory_gib'"),
    ({"preset": "a100-80gb", "gemm_flops_efficiency": 1.5},
     r"hardware.gemm_flops_efficiency must be a fraction in \(0, 1\]"),
    ({"preset": "a100-80gb", "memory_gib": -1}, "hardware.memory_gib must be a positive number"),
    ({"preset": "nope"}, "hardware: unknown preset 'nope'"),
    (3, "hardware: expected a preset name or a mapping"),
])
def test_bad_inline_hardware_names_the_key(value, message):
    with pytest.raises(ValueError, match=message):
        resolve_hardware(value)


# --- models ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, billions", [
    ("llama-2-7b", 6.74), ("llama-2-13b", 13.02), ("llama-2-70b", 68.98), ("llama-3-8b", 8.03),
    ("llama-3-70b", 70.55), ("llama-3.1-8b", 8.03), ("mistral-7b", 7.24), ("mistral-7b-v0.3", 7.25), ("qwen2-7b", 7.62), ("qwen2-0.5b", 0.494),
    ("llama-3.2-1b", 1.236), ("qwen3-8b", 8.19), ("qwen3-32b", 32.76),
    # Multimodal models' language models: the published 7.06B and 8.29B less their vision encoders.
    ("llava-1.5-7b", 6.74), ("qwen2-vl-7b", 7.62), ("qwen3-vl-8b", 8.19),
    # Published: Phi-4 14.7B, Phi-4-mini 3.8B, Phi-3.5-mini 3.8B, Granite-3.1-8B 8.17B, OLMo 2 7B 7.30B, Command-R
    # 35B, SmolLM3-3B 3,075,098,624 (its norms included).
    ("phi-4", 14.66), ("phi-4-mini", 3.836), ("phi-3.5-mini", 3.821), ("granite-3.1-8b", 8.17), ("olmo-2-7b", 7.30),
    ("command-r", 34.98), ("smollm3-3b", 3.075),
    # OLMo 3 7B and 32B (model cards: 7.3B, 32.2B).
    ("olmo-3-7b", 7.30), ("olmo-3-32b", 32.23),
])
def test_model_presets_have_their_published_parameter_counts(name, billions):
    assert resolve_model(name).num_parameters / 1e9 == pytest.approx(billions, rel=0.005)


def test_tiny_preset_exists_and_is_tiny():
    assert resolve_model("tiny").num_parameters < 1e6


def test_kv_and_weight_bytes_by_hand():
    llama2 = resolve_model("llama-2-7b")
    assert llama2.kv_bytes_per_token("float16") == 2 * 32 * 32 * 128 * 2 == 512 * 1024
    llama3 = resolve_model("llama-3-8b")  # grouped-query attention: 8 KV heads
    assert llama3.kv_bytes_per_token("bfloat16") == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    assert llama3.kv_bytes_per_token("fp8") == 64 * 1024
    assert llama3.weight_bytes("bfloat16") == 2 * llama3.num_parameters
    assert dtype_bytes("float32") == 4


def test_unknown_model_lists_the_presets():
    with pytest.raises(ValueError) as error:
        resolve_model("gpt-5")
    message = str(error.value)
    assert message.startswith("model: 'gpt-5' is neither a preset")
    assert all(name in message for name in MODEL_PRESETS)


def test_unknown_dtype_names_the_field():
    with pytest.raises(ValueError, match="dtype: unknown dtype 'int3'"):
        dtype_bytes("int3")


def test_model_shape_validates_its_fields():
    with pytest.raises(ValueError, match="model.num_kv_heads must divide num_attention_heads"):
        ModelShape("bad", 2, 64, 4, 3, 16, 128, 100, 64)
    with pytest.raises(ValueError, match="model.hidden_size must be a positive integer"):
        resolve_model({"name": "bad", "num_layers": 2, "hidden_size": 0, "num_attention_heads": 4, "num_kv_heads": 4,
                       "head_dim": 16, "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64})
    with pytest.raises(ValueError, match="model: unknown key 'layers'"):
        resolve_model({"layers": 2})
    with pytest.raises(ValueError, match="model: missing key 'num_layers'"):
        resolve_model({"name": "x"})


LLAMA_3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 8192, "hidden_act": "silu", "tie_word_embeddings": False, "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
}
QWEN2_05B_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "vocab_size": 151936,
    "max_position_embeddings": 131072, "hidden_act": "silu", "tie_word_embeddings": True,
}
# Qwen3-8B's published config.json, less the keys the shape does not read.
QWEN3_8B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "hidden_act": "silu", "tie_word_embeddings": False,
    "attention_bias": False,
}


def _fields_but_name(shape: ModelShape) -> dict:
    values = shape.to_dict()
    del values["name"]
    return values


@pytest.mark.parametrize("config, preset", [(LLAMA_3_8B_CONFIG, "llama-3-8b"), (QWEN2_05B_CONFIG, "qwen2-0.5b"),
                                            (QWEN3_8B_CONFIG, "qwen3-8b")])
def test_config_json_from_a_folder_or_a_file_matches_the_preset(tmp_path, config, preset):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    from_folder = resolve_model(str(folder))
    from_file = resolve_model(str(folder / "config.json"))
    assert from_folder == from_file
    assert from_folder.name == "checkpoint"
    assert _fields_but_name(from_folder) == _fields_but_name(resolve_model(preset))


def test_config_json_with_head_dim_null_uses_the_default(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_3_8B_CONFIG, "head_dim": None}))
    assert model_from_hf_config(tmp_path / "config.json").head_dim == 128
    # Qwen3's default is a figure of its own (transformers' Qwen3Config), not hidden_size / heads (64 here).
    (tmp_path / "config.json").write_text(json.dumps({**QWEN3_8B_CONFIG, "hidden_size": 2048, "head_dim": None}))
    assert model_from_hf_config(tmp_path / "config.json").head_dim == 128


@pytest.mark.parametrize("config, message", [
    ({**LLAMA_3_8B_CONFIG, "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "is not supported"),
    ({k: v for k, v in LLAMA_3_8B_CONFIG.items() if k != "hidden_size"}, "lacks the key 'hidden_size'"),
    ({**LLAMA_3_8B_CONFIG, "num_hidden_layers": "32"}, "key 'num_hidden_layers' must be a positive integer"),
    ({**LLAMA_3_8B_CONFIG, "hidden_act": "gelu"}, "key 'hidden_act'"),
])
def test_bad_config_json_names_model_and_the_key(tmp_path, config, message):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"^model: .*{message}"):
        resolve_model(str(tmp_path))


def test_config_json_that_is_not_json(tmp_path):
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ValueError, match="^model: cannot read .* as JSON"):
        resolve_model(str(tmp_path))


# --- KV-cache sizing ---------------------------------------------------------------------------------

def test_kv_cache_blocks_for_llama_3_8b_on_an_h100_by_hand():
    total = 81559 * 2**20                         # bytes CUDA sees on an H100 80GB
    weights = 8_030_261_248 * 2                   # 8.03B parameters in bf16: 14.96 GiB
    reserve = 0.03 * total                        # activation peak, CUDA context: 2.39 GiB
    block = 16 * 2 * 32 * 8 * 128 * 2             # 16 tokens of K and V: 2 MiB
    expected = math.floor((0.9 * total - weights - reserve) / block)
    blocks = kv_cache_num_blocks(resolve_model("llama-3-8b"), resolve_hardware("h100-sxm"), "bfloat16",
                                 block_size=16, gpu_memory_utilization=0.9)
    assert blocks == expected
    # about 54 GiB of KV: some 445k tokens, what vLLM reports for this model and card
    assert 27_000 < blocks < 29_000 and 430_000 < blocks * 16 < 460_000


def test_kv_cache_blocks_shrink_with_utilization_and_a_bigger_reserve():
    args = (resolve_model("llama-2-7b"), resolve_hardware("a100-80gb"), "float16", 16)
    assert kv_cache_num_blocks(*args, 0.8) < kv_cache_num_blocks(*args, 0.9)
    assert kv_cache_num_blocks(*args, 0.9, activation_reserve_fraction=0.1) < kv_cache_num_blocks(*args, 0.9)


def test_kv_cache_sizing_says_when_the_weights_do_not_fit():
    with pytest.raises(ValueError, match=r"^model: llama-2-70b weights take 128.48 GiB in bfloat16, but a100-40gb"):
        kv_cache_num_blocks(resolve_model("llama-2-70b"), resolve_hardware("a100-40gb"), "bfloat16", 16, 0.9)


@pytest.mark.parametrize("kwargs, message", [
    ({"block_size": 0}, "cache.block_size"),
    ({"gpu_memory_utilization": 1.5}, "cache.gpu_memory_utilization"),
    ({"activation_reserve_fraction": -0.1}, "cache.activation_reserve_fraction"),
])
def test_kv_cache_sizing_rejects_bad_arguments(kwargs, message):
    arguments = {"block_size": 16, "gpu_memory_utilization": 0.9, **kwargs}
    with pytest.raises(ValueError, match=message):
        kv_cache_num_blocks(resolve_model("tiny"), resolve_hardware("cpu"), "float32", **arguments)


def test_generated_default_model_presets_match_the_engine_generator():
    from engine.models.default_model import DEFAULT_MODEL_SPECS

    for size in ("tiny", "small"):
        spec, shape = DEFAULT_MODEL_SPECS[size], resolve_model(f"servesim-{size}")
        assert (shape.num_layers, shape.hidden_size, shape.num_attention_heads, shape.num_kv_heads,
                shape.intermediate_size, shape.vocab_size, shape.max_position_embeddings) == (
            spec["num_hidden_layers"], spec["hidden_size"], spec["num_attention_heads"], spec["num_key_value_heads"],
            spec["intermediate_size"], spec["vocab_size"], spec["max_position_embeddings"])
        assert shape.tied_embeddings == spec.get("tie_word_embeddings", False)
        assert resolve_model(size) is shape
