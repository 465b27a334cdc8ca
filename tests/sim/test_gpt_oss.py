"""gpt-oss in the simulator: the presets and config.json (windowed and full layers alternating, experts with a
top-4 router), and mxfp4 weight quantization (the routed experts in 4.25 bits, weight-only; sim/weight_quantization.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from sim.cost_models import AnalyticalCostModel, StepBatch
from sim.engine_setup import SetupError, build_setup
from sim.hardware import resolve_hardware
from sim.hf_model_config import model_from_hf_config
from sim.kv_cache_capacity import kv_cache_num_blocks
from sim.model_presets import resolve_model
from sim.run import main as sim_run_main
from sim.weight_quantization import weight_quantization
from workloads import example_path, load_workload
from workloads.errors import WorkloadError

MXFP4_BYTES = 4.25 / 8  # 4 bits a weight and an 8-bit scale per 32


# OpenAI's model card: gpt-oss-120b 116.83B total, 5.13B active per token; gpt-oss-20b 20.91B, 3.61B (the active
# counts leave the embedding out, and the totals include biases and sinks this shape leaves out).
@pytest.mark.parametrize("name, total_billions, active_billions", [("gpt-oss-120b", 116.83, 5.13),
                                                                   ("gpt-oss-20b", 20.91, 3.61)])
def test_presets_have_their_published_parameter_counts(name, total_billions, active_billions):
    model = resolve_model(name)
    assert model.num_parameters / 1e9 == pytest.approx(total_billions, rel=0.002)
    embedding = model.vocab_size * model.hidden_size
    assert (model.active_parameters - embedding) / 1e9 == pytest.approx(active_billions, rel=0.005)
    assert model.sliding_window == 128 and model.num_sliding_layers == model.num_layers // 2


def test_mxfp4_stores_the_experts_in_four_and_a_quarter_bits_and_the_rest_in_bf16():
    model = resolve_model("gpt-oss-120b")
    experts = 36 * 128 * 3 * 2880 * 2880
    rest = model.num_parameters - experts
    assert model.weight_bytes("bfloat16", "mxfp4") == pytest.approx(experts * MXFP4_BYTES + 2 * rest, rel=1e-12)
    # 65 GB: the published checkpoint's size; it fits one 80 GB H100, where bf16 (234 GB) does not.
    assert model.weight_bytes("bfloat16", "mxfp4") / 1e9 == pytest.approx(65.2, abs=0.1)
    h100 = resolve_hardware("h100-sxm")
    assert kv_cache_num_blocks(model, h100, "bfloat16", 16, 0.9, quantization="mxfp4") > 0
    with pytest.raises(ValueError, match="no room for even one KV block"):
        kv_cache_num_blocks(model, h100, "bfloat16", 16, 0.9)
    # fp8 quantizes every projection and expert in one byte.
    assert model.weight_bytes("bfloat16", "fp8") == pytest.approx(
        model.linear_parameters + 2 * (model.num_parameters - model.linear_parameters), rel=1e-12)


def test_mxfp4_experts_are_read_in_fewer_bytes_and_multiplied_at_the_16_bit_rate():
    model, h100 = resolve_model("gpt-oss-120b"), resolve_hardware("h100-sxm")
    mxfp4 = AnalyticalCostModel(model, h100, "bfloat16", quantization="mxfp4")
    fp8 = AnalyticalCostModel(model, h100, "bfloat16", quantization="fp8")
    bf16 = AnalyticalCostModel(model, h100, "bfloat16")
    experts, experts_fp8, experts_bf16 = (m.routed_experts for m in (mxfp4, fp8, bf16))
    assert experts.expert_weight_read_s == pytest.approx(experts_bf16.expert_weight_read_s * MXFP4_BYTES / 2)
    # Weight-only: the products run at the 16-bit rate, where fp8's run at the fp8 rate.
    assert experts.compute_s_per_row == experts_bf16.compute_s_per_row
    assert experts_fp8.compute_s_per_row < experts_bf16.compute_s_per_row
    # Attention stays in bf16 under mxfp4 (fp8 takes it to one byte).
    qkv = {m: {c.name: c for c in m.layer_linears}["qkv_proj"] for m in (mxfp4, fp8, bf16)}
    assert qkv[mxfp4].weight_read_s == qkv[bf16].weight_read_s == 2 * qkv[fp8].weight_read_s
    # A decode batch reads mostly experts: mxfp4 is the fastest of the three.
    batch = StepBatch([1] * 16, [1500] * 16)
    assert mxfp4.step_time(batch) < fp8.step_time(batch) < bf16.step_time(batch)
    description = mxfp4.describe()
    idle = 36 * 124 * 3 * 2880 * 2880 * MXFP4_BYTES
    assert description["weight_read_s_one_token"] == pytest.approx(
        (model.weight_bytes("bfloat16", "mxfp4") - idle) / h100.achievable_bandwidth, rel=1e-12)


def test_mxfp4_on_a_dense_model_and_an_unknown_scheme_are_refused_by_field():
    with pytest.raises(ValueError, match=r"^engine.quantization: mxfp4 quantizes a mixture of experts' routed "
                                         r"experts only, and 'llama-3-8b' has none"):
        AnalyticalCostModel(resolve_model("llama-3-8b"), resolve_hardware("h100-sxm"), "bfloat16",
                            quantization="mxfp4")
    with pytest.raises(ValueError, match=r"^engine.quantization: unknown scheme 'int3'"):
        weight_quantization("int3")
    workload = load_workload(example_path("chat"), overrides=["engine.quantization=mxfp4"])
    with pytest.raises(SetupError, match="engine.quantization: mxfp4"):
        build_setup(workload)
    with pytest.raises(WorkloadError, match="quantization"):
        load_workload(example_path("chat"), overrides=["engine.quantization=nf4"])


GPT_OSS_120B_CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True, "experts_per_token": 4,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 18, "max_position_embeddings": 131072,
    "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "num_local_experts": 128, "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False,
    "vocab_size": 201088, "rope_theta": 150000,
    "quantization_config": {"quant_method": "mxfp4",
                            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"]},
}


def test_a_config_json_reads_as_its_preset(tmp_path):
    folder = tmp_path / "gpt-oss-120b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GPT_OSS_120B_CONFIG))
    assert replace(model_from_hf_config(folder / "config.json"), name="gpt-oss-120b") == resolve_model("gpt-oss-120b")
    # transformers' defaults fill what a config leaves out: windows on the even layers, 64-wide heads, biases.
    sparse = {key: value for key, value in GPT_OSS_120B_CONFIG.items()
              if key not in ("layer_types", "head_dim", "attention_bias", "sliding_window", "architectures")}
    sparse.update(num_hidden_layers=24, num_local_experts=32)
    (folder / "config.json").write_text(json.dumps(sparse))
    assert replace(model_from_hf_config(folder / "config.json"), name="gpt-oss-20b") == resolve_model("gpt-oss-20b")


def test_the_gpt_oss_example_runs_and_a_second_h100_ends_the_preemptions(tmp_path):
    out = tmp_path / "gpt_oss"
    assert sim_run_main(["gpt_oss", "--set", "workload.num_requests=200", "--set", "workload.arrival.rate=8",
                         "--set", "sweep={engine.tensor_parallel_size: [1, 2]}", "--out", str(out),
                         "--no-progress", "--no-dashboard", "--quiet"]) == 0
    table = pd.read_csv(out / "sweep.csv").set_index("point")
    one, two = table.loc["tensor_parallel_size=1"], table.loc["tensor_parallel_size=2"]
    assert one.num_preemptions > 0 and two.num_preemptions == 0
    assert two.slo_attainment > one.slo_attainment
    summary = json.loads((out / "tensor_parallel_size=1" / "summary.json").read_text())
    assert summary["config"]["cache"]["kv_cache_groups"] == [None, 128]  # vLLM's hybrid KV cache
