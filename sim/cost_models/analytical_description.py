"""What ``AnalyticalCostModel.describe()`` reports (summary.json's cost_model): the model's and device's figures, and
the floors and constants a reader checks a prediction against."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.model_shapes import dtype_bytes

if TYPE_CHECKING:  # analytical.py imports this module
    from sim.cost_models.analytical import AnalyticalCostModel


def describe_analytical(cost_model: AnalyticalCostModel) -> dict:
    m, hw, dtype = cost_model.model, cost_model.hardware, cost_model.dtype
    weight_bytes = m.weight_bytes(dtype, cost_model.quantization)
    gemm_flops = hw.achievable_gemm_flops(dtype)
    shard = cost_model.shard
    scheme = cost_model.weight_quantization
    expert_weight_bytes = scheme.bytes_per_weight if scheme is not None else dtype_bytes(dtype)
    # A GPU's routed experts: its tensor-parallel slice of every one, or with data-parallel ranks 1/D of those.
    ranks = 1 if cost_model.expert_parallel is None else cost_model.expert_parallel.data_parallel_size
    one_expert_bytes = shard.num_moe_layers * shard.expert_parameters * expert_weight_bytes
    other_bytes = shard.weight_bytes(dtype, cost_model.quantization) - shard.num_experts * one_expert_bytes
    weight_bytes_per_gpu = other_bytes + shard.num_experts * one_expert_bytes / ranks
    one_token_bytes = other_bytes + shard.num_experts_per_token * one_expert_bytes / ranks
    return {
        "kind": "analytical",
        "model": m.to_dict(),
        "num_parameters": m.num_parameters,
        # What one token computes with; less than num_parameters for a mixture of experts.
        "active_parameters": m.active_parameters,
        "num_experts": m.num_experts,
        "num_experts_per_token": m.num_experts_per_token,
        "tensor_parallel_size": cost_model.tensor_parallel_size,
        "pipeline_parallel_size": cost_model.pipeline_parallel_size,
        "pipeline_stage_layers": m.pipeline_stage_layers(cost_model.pipeline_parallel_size),
        "kv_cache_dtype": cost_model.kv_cache_dtype,
        "quantization": cost_model.quantization,
        "hardware": hw.to_dict(),
        "dtype": dtype,
        "weight_bytes": weight_bytes,
        "weight_bytes_per_gpu": weight_bytes_per_gpu,
        "kv_bytes_per_token": m.kv_bytes_per_token(cost_model.kv_cache_dtype),
        "achievable_gemm_tflops": gemm_flops / 1e12,
        "achievable_bandwidth_gbps": hw.achievable_bandwidth / 1e9,
        # Tokens per step past which linear layers stop being bound by reading their weights.
        "ridge_point_tokens": gemm_flops * cost_model._element_bytes / (2 * hw.achievable_bandwidth),
        # The floor of any step, before fixed costs: every weight of a GPU's shard read once (slightly
        # high: the embedding table is only gathered row by row). For a mixture of experts, the floor
        # of a step large enough to read every expert.
        "weight_read_s": weight_bytes_per_gpu / hw.achievable_bandwidth,
        # A one-token step's weights: a mixture of experts reads only the k experts the token is routed
        # to (equal to weight_read_s for a dense model).
        "weight_read_s_one_token": one_token_bytes / hw.achievable_bandwidth,
        "fixed_overhead_s": cost_model._fixed_s,
        "kernels_per_layer": cost_model.kernels_per_layer,  # an MoE layer's for a mixture of experts
        "kernels_all_layers": cost_model._kernels_all_layers,
        "attention": "multi-head latent" if m.is_mla else "grouped-query",
        "num_dense_mlp_layers": m.num_dense_mlp_layers,
        "sampling_passes_over_logits": cost_model.sampling_passes_over_logits,
        **({"lora": cost_model.lora.describe()} if cost_model.lora is not None else {}),
        **({"vision_encoder": cost_model.vision.describe()} if cost_model.vision is not None else {}),
        **({"expert_parallel": cost_model.expert_parallel.describe()}
           if cost_model.expert_parallel is not None else {}),
    }

