"""DeepSeek-V2/V3 in the analytical cost model: multi-head latent attention decoding in the latent space (compute-
bound with many heads on a GPU) and prefilling with decompressed keys and values (kv_b_proj over every cached token a
chunk attends to), dense first layers priced apart from the MoE layers, and the physics no step may beat."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cost_models import AnalyticalCostModel, StepBatch, step_features
from sim.cost_models.attention_work import attention_work
from sim.hardware import resolve_hardware
from sim.model_presets import resolve_model

GB = 1e9


def analytical(model, hardware: str = "h200", **options) -> AnalyticalCostModel:
    shape = resolve_model(model) if isinstance(model, str) else model
    return AnalyticalCostModel(shape, resolve_hardware(hardware), "bfloat16", **options)


def seconds_per_pair_and_per_cached_token(model, hardware, tensor_parallel_size):
    """A decode's attention per cached token: FLOPs at the attention rate, bytes at the bandwidth."""
    shard = resolve_model(model).shard(tensor_parallel_size)
    work = attention_work(shard, 2, 2)
    spec = resolve_hardware(hardware)
    return (work.decode_flops_per_pair / spec.achievable_attention_flops("bfloat16"),
            work.kv_bytes_per_cached_token / spec.achievable_bandwidth)


def test_latent_decode_is_compute_bound_with_all_heads_on_one_gpu_and_bytes_bound_split_eight_ways():
    # 128 heads score one 576-number latent per cached token: ~240 FLOPs per byte read. Grouped-query
    # attention's 8 query heads per KV head make ~8.
    flops_s, bytes_s = seconds_per_pair_and_per_cached_token("deepseek-v3", "h200", 1)
    assert flops_s > bytes_s
    flops_s, bytes_s = seconds_per_pair_and_per_cached_token("deepseek-v3", "h200", 8)
    assert flops_s < bytes_s
    flops_s, bytes_s = seconds_per_pair_and_per_cached_token("llama-3-70b", "h200", 1)
    assert flops_s < bytes_s / 10


def test_a_prefill_chunk_after_a_cached_context_decompresses_the_context():
    """kv_b_proj runs over the chunk's own tokens and every cached token it attends to; a grouped-query model's
    projections do not grow with the context."""
    deepseek, llama = analytical("deepseek-v2-lite"), analytical("llama-3-8b")
    fresh, late = StepBatch([512], [0]), StepBatch([512], [16384])
    kv_b = deepseek.context_linear
    assert kv_b.name == "kv_b_proj" and (kv_b.in_features, kv_b.out_features) == (512, 16 * (128 + 128))
    grown = deepseek.breakdown(late)["linear_layers"] - deepseek.breakdown(fresh)["linear_layers"]
    layers = 27
    assert grown == pytest.approx(layers * (kv_b.time(512 + 16384) - kv_b.time(512)), rel=1e-9)
    assert llama.breakdown(late)["linear_layers"] == llama.breakdown(fresh)["linear_layers"]
    # A decode's absorbed products cost one pass of kv_b_proj per query row, whatever its context.
    decode_short, decode_long = StepBatch([1] * 8, [100] * 8), StepBatch([1] * 8, [20000] * 8)
    assert deepseek.breakdown(decode_short)["linear_layers"] == deepseek.breakdown(decode_long)["linear_layers"]


def test_dense_first_layers_are_priced_as_dense_mlps():
    """DeepSeek-V3's first three layers run a dense MLP: at a batch that wakes every expert, three dense MLPs cost
    what they do in place of three MoE layers' 257 experts."""
    v3 = resolve_model("deepseek-v3")
    with_dense = analytical(v3, tensor_parallel_size=8)
    all_moe = analytical(replace(v3, num_dense_layers=0), tensor_parallel_size=8)
    (dense_count, dense_mlp), (moe_count, moe_mlp) = with_dense.layer_kinds
    assert (dense_count, moe_count) == (3, 58) and moe_mlp.routed_experts is not None
    assert [c.name for c in dense_mlp.linears] == ["gate_up_proj", "down_proj"]
    assert all_moe.layer_kinds[0][0] == 0

    def mlp_time(mlp, tokens):
        experts = mlp.routed_experts.time(tokens) if mlp.routed_experts else 0.0
        return experts + sum(c.time(tokens) for c in mlp.linears)

    tokens = 256
    batch = StepBatch([1] * tokens, [2000] * tokens)
    saved = all_moe.breakdown(batch)["linear_layers"] - with_dense.breakdown(batch)["linear_layers"]
    assert saved == pytest.approx(3 * (mlp_time(moe_mlp, tokens) - mlp_time(dense_mlp, tokens)), rel=1e-9)
    assert saved > 0
    # Kernels: a dense layer 4 + 10 (latent attention with a query rank) + 3, an MoE layer 4 + 10 + 7 + 4 (an
    # ungated shared expert).
    assert with_dense.kernels_per_layer == 25
    assert with_dense.describe()["kernels_all_layers"] == 3 * 17 + 58 * 25


def test_one_decode_token_reads_the_active_weights():
    model = analytical("deepseek-v3", tensor_parallel_size=8, quantization="fp8")
    description = model.describe()
    # One token reads the attention, three dense MLPs, and 8 routed + 1 shared experts of each of the 58 MoE
    # layers (248 of 256 routed experts idle), each GPU its shard, in fp8.
    shard = resolve_model("deepseek-v3").shard(8)
    idle_bytes = 58 * 248 * shard.expert_parameters
    one_token_bytes = shard.weight_bytes("bfloat16", "fp8") - idle_bytes
    bandwidth = resolve_hardware("h200").achievable_bandwidth
    assert description["weight_read_s_one_token"] == pytest.approx(one_token_bytes / bandwidth, rel=1e-12)
    assert description["weight_read_s"] > 12 * description["weight_read_s_one_token"]
    assert description["attention"] == "multi-head latent" and description["num_dense_mlp_layers"] == 3


@pytest.mark.parametrize("tensor_parallel_size", [1, 8])
@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(["deepseek-v3", "deepseek-v2-lite", "kimi-k2"]),
       requests=st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 30000)), min_size=1, max_size=20))
def test_no_prediction_beats_the_datasheet(tensor_parallel_size, model, requests):
    """A step is never faster than its FLOPs (each GPU its share) at peak or its bytes at peak bandwidth."""
    if resolve_model(model).num_attention_heads % tensor_parallel_size:
        return
    cost_model = analytical(model, "h100-sxm", tensor_parallel_size=tensor_parallel_size)
    batch = StepBatch([q for q, _ in requests], [ctx for _, ctx in requests])
    flops, _ = cost_model.step_flops_and_bytes(batch)
    spec = resolve_hardware("h100-sxm")
    assert cost_model.step_time(batch) >= flops / tensor_parallel_size / spec.peak_flops("bfloat16")
    if tensor_parallel_size == 1:
        _, bytes_moved = cost_model.step_flops_and_bytes(batch)
        assert cost_model.step_time(batch) >= bytes_moved / (spec.memory_bandwidth_gbps * GB)


@pytest.mark.parametrize("tokens, context", [(1, 1000), (64, 2000), (4096, 0)])
def test_pipeline_stages_hold_their_own_layers_mlps(tokens, context):
    """DeepSeek-V3 on 16 H100s, tensor parallel 8 and two stages: the first stage's 31 layers hold the three dense
    ones, the second's 30 are all MoE. Each stage runs its share of the per-layer work and its own layers' MLPs;
    together they are the one-stage step's work, plus the hand-over, less the engine's own overhead."""
    one = analytical("deepseek-v3", "h100-sxm", tensor_parallel_size=8, quantization="fp8")
    two = analytical("deepseek-v3", "h100-sxm", tensor_parallel_size=8, quantization="fp8", pipeline_parallel_size=2)
    batch = StepBatch([1] * tokens, [context] * tokens) if tokens < 4096 else StepBatch([tokens], [context])
    features = step_features(batch)
    stages = two.pipeline_stage_times(features)
    components = dict(zip(("linear", "elementwise", "decode", "prefill", "lm_head", "sampling", "fixed",
                           "communication"), one.component_times(features)))
    logits_gather = one._communication_parts(features)[1]
    # What the layers do, whichever stage runs them.
    per_layer_work = sum(components.values()) - one.hardware.step_overhead_s - components["lm_head"] \
        - components["sampling"] - two._launch_s_outside_layers - logits_gather
    hand_over = two._send_latency_s + features.num_tokens * two._send_bytes_per_token * two._send_s_per_byte \
        + two._gather_latency_s + features.num_tokens * two._gather_s_per_token
    last_stage_extra = components["lm_head"] + components["sampling"] + two._launch_s_outside_layers + logits_gather
    assert sum(stages) == pytest.approx(per_layer_work + hand_over + last_stage_extra, rel=1e-9)
    # The first stage: 31/61 of the per-layer work but the MLPs, the three dense MLPs and 28 of the 58 MoE ones.
    (dense_count, _), (moe_count, _) = two.layer_kinds
    dense_mlp, moe_mlp = two._mlp_times(features.num_tokens)
    first = 31 / 61 * (per_layer_work - dense_mlp - moe_mlp) + dense_mlp + 28 / moe_count * moe_mlp
    assert stages[0] - hand_over == pytest.approx(first, rel=1e-9)
    if tokens >= 64:  # split by layer count alone, the first stage would take more: dense MLPs cost less there
        assert stages[0] - hand_over < 31 / 61 * per_layer_work


def test_deepseek_v3_runs_on_sixteen_h100s_in_two_stages(tmp_path):
    from sim.run import main as sim_run_main

    out = tmp_path / "pp"
    assert sim_run_main(["deepseek", "--set", "sweep=null", "--set", "hardware=h100-sxm", "--set",
                         "engine.pipeline_parallel_size=2", "--set", "workload.num_requests=40", "--out", str(out),
                         "--no-progress", "--no-dashboard", "--quiet"]) == 0


def test_the_deepseek_example_runs_and_an_fp8_cache_doubles_the_pool_and_ends_preemptions(tmp_path):
    import json

    import pandas as pd

    from sim.run import main as sim_run_main

    out = tmp_path / "deepseek"
    assert sim_run_main(["deepseek", "--set", "workload.num_requests=200", "--set", "workload.arrival.rate=2.5",
                         "--set", "sweep={engine.kv_cache_dtype: [auto, fp8]}", "--out", str(out), "--no-progress",
                         "--no-dashboard", "--quiet"]) == 0
    table = pd.read_csv(out / "sweep.csv").set_index("point")
    bf16, fp8 = table.loc["kv_cache_dtype=auto"], table.loc["kv_cache_dtype=fp8"]
    blocks = {point: json.loads((out / point.replace(",", "_") / "summary.json").read_text())["config"]["cache"]
              ["num_gpu_blocks"] for point in table.index}
    # ~655k tokens of 70 KB each in bf16 (the latent whole on every GPU), twice as many in fp8.
    assert 600_000 < 16 * blocks["kv_cache_dtype=auto"] < 700_000
    assert blocks["kv_cache_dtype=fp8"] == pytest.approx(2 * blocks["kv_cache_dtype=auto"], abs=1)
    assert bf16.num_preemptions > 0 and fp8.num_preemptions == 0
    assert fp8.slo_attainment > bf16.slo_attainment
