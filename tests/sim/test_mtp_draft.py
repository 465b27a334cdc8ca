"""Speculative decoding with DeepSeek-V3's multi-token-prediction module (method mtp, sim/mtp_draft.py): a one-layer
draft of the model's own shape, quantized as the model is, with its own KV cache beside the model's."""

from __future__ import annotations

import json

import pytest

from sim.engine_setup import SetupError, build_setup
from sim.hardware import resolve_hardware
from sim.kv_cache_capacity import kv_cache_num_blocks
from sim.model_presets import resolve_model
from sim.mtp_draft import mtp_draft_shape
from sim.run import main as sim_run_main
from workloads import example_path, load_workload
from workloads.errors import WorkloadError

MTP = "engine.speculative_decoding={method: mtp, num_speculative_tokens: 1, acceptance_rate: 0.85}"


def deepseek(*overrides):
    return load_workload(example_path("deepseek"), overrides=["sweep=null", "workload.num_requests=60", *overrides])


def test_the_mtp_module_is_one_layer_of_the_models_own_kind():
    model = resolve_model("deepseek-v3")
    assert model.num_mtp_layers == 1
    draft = mtp_draft_shape(model)
    assert draft.num_layers == 1 and draft.num_moe_layers == 1 and draft.is_mla
    assert draft.num_experts == 256 and draft.vocab_size == model.vocab_size
    # DeepSeek-V3's checkpoint holds a 14B module: one MoE layer, its own embedding and head (eh_proj left out).
    assert draft.num_parameters / 1e9 == pytest.approx(13.4, rel=0.02)
    # Not part of the served model's count.
    assert model.num_parameters / 1e9 == pytest.approx(671.0, rel=0.001)


def test_the_mtp_module_is_quantized_and_holds_its_layers_cache_beside_the_models():
    setup = build_setup(deepseek(MTP))
    draft = setup.speculation.draft_cost_model
    assert setup.speculation.method == "mtp" and draft.model.name == "deepseek-v3 MTP module"
    assert draft.quantization == "fp8" and draft.tensor_parallel_size == 8
    model, h200 = resolve_model("deepseek-v3"), resolve_hardware("h200")
    without = kv_cache_num_blocks(model, h200, "bfloat16", 16, 0.9, tensor_parallel_size=8, quantization="fp8")
    with_mtp = kv_cache_num_blocks(model, h200, "bfloat16", 16, 0.9, tensor_parallel_size=8, quantization="fp8",
                                   draft_model=mtp_draft_shape(model), draft_quantization="fp8")
    assert setup.cache_config.num_gpu_blocks == with_mtp
    # 62 layers of cache a block instead of 61, and the module's weights (1.7 GB a GPU) off the budget.
    assert with_mtp < without * 61 / 62
    unquantized = kv_cache_num_blocks(model, h200, "bfloat16", 16, 0.9, tensor_parallel_size=8, quantization="fp8",
                                      draft_model=mtp_draft_shape(model))
    assert unquantized < with_mtp


def test_one_mtp_draft_accepted_85_percent_of_the_time_cuts_the_time_per_output_token(tmp_path):
    tpot = {}
    for name, overrides in (("off", []), ("mtp", [MTP])):
        out = tmp_path / name
        assert sim_run_main(["deepseek", "--set", "sweep=null", "--set", "workload.num_requests=80", "--set",
                             "workload.arrival.rate=1", *[arg for o in overrides for arg in ("--set", o)],
                             "--out", str(out), "--no-progress", "--no-dashboard", "--quiet"]) == 0
        summary = json.loads((out / "summary.json").read_text())
        tpot[name] = summary["tpot_ms"]["p50"]
    # 1.85 tokens a step for a step a little dearer (the verification row, the module's pass): ~1.7x.
    assert 1.4 < tpot["off"] / tpot["mtp"] < 1.85


def test_mtp_without_a_module_and_a_draft_model_with_mtp_are_refused_by_field():
    with pytest.raises(SetupError, match=r"^engine.speculative_decoding.method: mtp drafts with the model's "
                                         r"multi-token-prediction module, but 'deepseek-v2' has none"):
        build_setup(deepseek(MTP, "model=deepseek-v2"))
    with pytest.raises(WorkloadError, match="draft_model"):
        deepseek("engine.speculative_decoding={method: mtp, num_speculative_tokens: 1, acceptance_rate: 0.85, "
                 "draft_model: llama-3.2-1b}")
